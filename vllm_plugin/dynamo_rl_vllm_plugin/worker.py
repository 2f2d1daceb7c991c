"""Worker extension (``--worker-extension-cls dynamo_rl_vllm_plugin.worker.DynamoRLWorkerExtension``).

vLLM mixes this class into its worker class; its methods are then callable over
``POST /collective_rpc {"method": ...}`` (the route exists with ``VLLM_SERVER_DEV_MODE=1``).
vLLM refuses an extension that redefines a worker attribute, so the fixed reload has a name of
its own rather than replacing ``reload_weights``.
"""

from __future__ import annotations

from typing import Any

from dynamo_rl_vllm_plugin._tied import refresh_embedding_kernels


class DynamoRLWorkerExtension:
    """Methods added to vLLM's worker."""

    def dynamo_rl_reload_weights(self, weights_path: str | None = None, **kwargs: Any) -> int:
        """``reload_weights`` (from ``weights_path``, or the model's own folder) followed by the
        output layer's post-processing, which vLLM's in-place reload skips for tied embeddings
        on CPU. Returns the number of embedding layers refreshed."""
        self.reload_weights(weights_path=weights_path, **kwargs)  # type: ignore[attr-defined]
        return refresh_embedding_kernels(self.model_runner.get_model())  # type: ignore[attr-defined]
