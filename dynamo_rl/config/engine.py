"""The inference engine's section: which engine serves the model (``kind``), the embedded engine's
settings (``dynamo-rl engine``) and a vLLM server's (``dynamo-rl vllm-server``, ``engine.vllm``).

The bearer token for the control endpoints is not here: it is ``endpoints.control_token``
(``DYNAMO_CONTROL_TOKEN``), shared with the learner that pushes weights.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dynamo_rl.config.base import Section
from dynamo_rl.config.common import Host, Port

EngineKind = Literal["embedded", "vllm", "sglang"]


class VLLMServerConfig(Section):
    """A vLLM server started by ``dynamo-rl vllm-server`` (what ``up`` runs with ``engine.kind=vllm``):
    ``PYTHON -m vllm.entrypoints.openai.api_server`` with ``engine.model``, ``engine.dtype``,
    ``engine.host``/``engine.port``, ``--logprobs-mode`` from ``engine.logprobs_mode``, eager mode,
    ``VLLM_SERVER_DEV_MODE=1`` and the weight-transfer backend below (docs/engine.md)."""

    python: str = ".venv-vllm/bin/python"
    """Interpreter of the vLLM environment (``bash scripts/setup.sh --vllm`` makes it); a relative
    path is taken from the current directory."""
    max_model_len: Annotated[int, Field(ge=16)] = 1024
    """``--max-model-len``: longest prompt + response the server accepts."""
    kv_cache_gib: Annotated[float, Field(gt=0)] = 1.0
    """KV cache of the CPU build, in GiB (``VLLM_CPU_KVCACHE_SPACE``)."""
    weight_transfer_backend: Literal["gloo", "nccl"] = "gloo"
    """``--weight-transfer-config`` backend: ``gloo`` (the project's plugin, ``vllm_plugin/``, for
    CPU servers) or vLLM's own ``nccl`` (CUDA)."""
    cache_dir: str | None = None
    """vLLM's cache folder (``VLLM_CACHE_ROOT``: compiled kernels, …); null: ``<run dir>/vllm-cache``,
    never the home directory."""
    extra_args: list[str] = []
    """More vLLM command-line arguments, appended as given."""
    unhealthy_exit_s: Annotated[float, Field(gt=0)] = 60.0
    """Once ready, a server whose ``/health`` fails this long is stopped (and so restarted by its
    supervisor): vLLM's API server can hang in its shutdown after its engine core died."""


class EngineConfig(Section):
    kind: EngineKind = "embedded"
    """Which server samples: ``embedded`` (``dynamo-rl engine``), ``vllm`` (a vLLM server,
    ``engine.vllm``; it needs ``rollout.weight_api=vllm``, which it implies when unset) or
    ``sglang`` (SGLang servers you start yourself, listed in ``endpoints.engine_urls``; ``up``
    does not start them)."""
    host: Host = "127.0.0.1"
    """Address to bind. A non-loopback address needs ``endpoints.control_token`` set."""
    port: Port = 8000
    """HTTP port (0: a free one, printed in the log)."""
    model: str | None = None
    """Hugging Face model directory to serve (required to start the engine)."""
    served_model_name: str | None = None
    """Model name reported by ``/v1/models`` and in responses (default: the directory's name)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the model runs; ``cuda`` also allows NCCL weight-update groups."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Weights and activations dtype; ``auto`` keeps the checkpoint's. float32 keeps returned
    log-probs within 1e-4 of the learner's forward pass."""
    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = 64
    """Most sequences decoded together in one batch (prompts x n)."""
    batching: Literal["static", "continuous"] = "static"
    """What requests arriving while a batch decodes do: ``static``, wait for the next batch (a
    batch lasts as long as its longest sequence); ``continuous``, join the running batch at a
    token boundary, every 8 steps at most, each join one prefill of the joining prompts (pays
    off with long-tailed response lengths and several rollout workers; docs/engine.md). The
    embedded engine's; vLLM and SGLang batch continuously on their own."""
    batch_wait_ms: Annotated[float, Field(ge=0, le=1000)] = 2.0
    """After the first request of an idle engine arrives, wait this long for others to join its
    batch ("requests that arrive together are decoded together")."""
    max_new_tokens: Annotated[int, Field(ge=1)] = 4096
    """Cap on ``max_tokens`` per request; a larger request is a 422 naming the field."""
    default_max_tokens: Annotated[int, Field(ge=1)] = 256
    """``max_tokens`` when a request leaves it out (also capped by the context left)."""
    logprobs_mode: Literal["processed", "raw"] = "processed"
    """Distribution of the returned log-probs (like vLLM's ``--logprobs-mode``): ``processed``,
    the one sampled from (after temperature, top-k, top-p), which is what the learner computes
    when top-k/top-p are off (it divides its logits by the sampling temperature); ``raw``, the
    model's own (before temperature). Greedy requests report raw log-probs in both modes."""
    max_logprobs: Annotated[int, Field(ge=0, le=20)] = 5
    """Largest ``logprobs`` (top-k alternatives per token) a request may ask for."""
    threads: Annotated[int, Field(ge=1)] | None = None
    """torch intra-op threads (default: torch's own choice, OMP_NUM_THREADS)."""
    register_in_redis: bool = True
    """Register in Redis (``engines_key(run.name)`` at ``endpoints.redis_url``) on start and after
    every weight update; an unreachable Redis is logged, never fatal."""
    advertise_url: str | None = None
    """Base URL others reach this engine at, as registered in Redis
    (default: ``http://HOST:PORT`` with the bound port)."""
    max_lora_rank: Annotated[int, Field(ge=1)] = 64
    """Largest LoRA rank an adapter load (``learner.lora``) may bring; a larger one is refused
    naming both. A vLLM server gets it as ``--max-lora-rank`` (vLLM accepts 1, 8, 16, 32, 64,
    128, 256, 320, 512)."""
    weight_update_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """Timeout of the weight-update process group (forming it and each broadcast)."""
    vllm: VLLMServerConfig = VLLMServerConfig()
    """``engine.kind=vllm``: how the vLLM server is started."""
