"""DynaMO-RL's vLLM plugin, loaded by vLLM itself (entry point ``vllm.general_plugins``).

- ``gloo`` weight-transfer backend (:mod:`.gloo`): every backend vLLM ships (``nccl``, ``ipc``, …)
  needs CUDA; this one broadcasts over a gloo process group, so a trainer can push weights to a
  CPU vLLM server through vLLM's own weight-transfer routes.
- Worker extension (:mod:`.worker`, ``--worker-extension-cls
  dynamo_rl_vllm_plugin.worker.DynamoRLWorkerExtension``): reload-from-disk that is correct for
  models with tied embeddings on CPU.

The package runs inside the vLLM server's environment and imports nothing of DynaMO-RL.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """vLLM's general-plugin hook: called in every vLLM process (API server, engine core,
    workers) before the engine is built, so the backend name is known wherever it is looked up.
    """
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    # Registered by module path: gloo.py (and torch.distributed) loads only when a server is
    # started with --weight-transfer-config '{"backend": "gloo"}'. vLLM refuses a second
    # registration of a name, and register() can run more than once in one process.
    if "gloo" not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            "gloo", "dynamo_rl_vllm_plugin.gloo", "GlooWeightTransferEngine"
        )
