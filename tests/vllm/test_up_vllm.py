"""``dynamo-rl up`` with ``engine.kind=vllm``: real vLLM servers sample, the learner pushes to them,
and a vLLM server killed with ``kill -9`` mid-run is restarted by ``up`` while training goes on,
with ``rollout.max_staleness: 1`` (the restarted server gets the current weights pushed).

One small run (the quickstart's tiny-model shape: vLLM's CPU attention needs a head size it
supports), ``up.engines=1``: at most one vLLM server at a time.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.reliability.helpers import UpRun
from tests.vllm.conftest import VLLM_PYTHON, require_vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STEPS = 8
KILL_AFTER_STEP = 3


def _vllm_api_server(wrapper_pid: int) -> int:
    """The vLLM API server: the child of ``dynamo-rl vllm-server`` running vLLM's entry point."""
    for child in Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text().split():
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"vllm.entrypoints.openai.api_server" in cmdline:
            return int(child)
    raise AssertionError(f"no vLLM API server among the children of {wrapper_pid}")


def test_up_with_vllm_pushes_and_restarts_a_killed_server(tmp_path: Path) -> None:
    require_vllm_env()
    run = UpRun(
        tmp_path / "run",
        "upvllm",
        STEPS,
        # The quickstart's model shape (the small runs' head size 8 is not one vLLM's CPU build has).
        "up.tiny_model.hidden_size=128", "up.tiny_model.num_layers=2",
        "engine.kind=vllm",
        f"engine.vllm.python={VLLM_PYTHON}",
        "engine.vllm.max_model_len=256",
        "up.health_timeout_s=900",
        "up.restart.backoff_s=1.0",
        # A push into a server that died must not hold the learner for push.timeout_s's default.
        "learner.push.timeout_s=60",
        # A restarted vLLM serves engine.model (version 0) until the next push, and vLLM has no
        # load-from-disk route: the worker's gate (1) holds it until the learner, finding the
        # engine behind while it waits for groups, pushes to it again (learner/stream_source.py CATCH_UP_S).
        "rollout.max_staleness=1",
        # Unseeded: vLLM 0.32's CPU engine dies on a seeded request prefilled in chunks.
        "rollout.sampling.seed=null",
        "learner.checkpoint.every=100",
    )  # fmt: skip
    try:
        run.wait("vLLM ready", lambda: "engine0 ready at" in run.output(), timeout=900)
        run.wait(f"step {KILL_AFTER_STEP}",
                 lambda: any(r["step"] >= KILL_AFTER_STEP for r in run.records()),
                 timeout=900)  # fmt: skip
        wrapper = run.pid("engine0")
        server = _vllm_api_server(wrapper)
        os.kill(server, signal.SIGKILL)
        run.wait_restart("engine0")
        restarted = run.pid("engine0")
        assert restarted != wrapper
        run.proc.wait(timeout=1800)
    finally:
        run.stop()
    out = run.output()
    assert run.proc.returncode == 0, out[-4000:]
    assert "engine0 exited with code 137" in out, out[-4000:]
    summary = json.loads((run.run_dir / "summary.json").read_text())
    # Only the engine was restarted. Possibly twice: the learner's first push after the restart
    # still holds the group of the killed server (same URL), the new server answers its update
    # with "not initialised" after start_weight_update, and its engine core then dies at the next
    # step (EngineDeadError; the API server exits 0) — restarted again, then pushed to afresh.
    assert set(summary["restarts"]) == {"engine0"} and summary["restarts"]["engine0"] >= 1, summary

    # It was vLLM that served: its own log lines, from its own environment.
    log = run.log("engine0")
    assert "vllm.entrypoints.openai.api_server" in log and "vLLM ready at" in log, log[-3000:]
    assert log.count("vLLM ready at") == 1 + summary["restarts"]["engine0"], "restarts got ready"

    records = {int(r["step"]): r for r in run.records()}
    assert max(records) == STEPS
    pushed = [s for s, r in sorted(records.items()) if r.get("push_ok")]
    # Pushes reached vLLM before the kill and reached the restarted server after it.
    assert any(s < KILL_AFTER_STEP for s in pushed), pushed
    assert any(s > KILL_AFTER_STEP + 1 for s in pushed), (pushed, log[-3000:])
    assert records[STEPS]["weight_version"] > KILL_AFTER_STEP
    # The restarted server (version 0) served no rollout before the learner pushed to it (the
    # worker's pool holds it, "too old to serve"): no step trained on a sample KILL_AFTER_STEP or
    # more versions old.
    lags = {int(k.removeprefix("mismatch_kl_lag")) for r in records.values() for k in r
            if k.startswith("mismatch_kl_lag")}  # fmt: skip
    assert max(lags) < KILL_AFTER_STEP, lags
