"""A dead or stopped engine does not stall the learner's push: ``kill -9`` of one of two real
embedded engines in the middle of a push (while it is paused for the update, its broadcast under
way); SIGSTOP of one, before a push and in the middle of one.

The learner's real push (``learner.push.DistributedPush``, one-rank gloo world standing for the
learner, the vLLM-shaped protocol so that "mid-push" is observable as the engine's pause) must
return within seconds — not after ``push.timeout_s`` — with the surviving engine on the new
version; the next push, with the dead engine still registered, too; and once the engine is back
(a new process on the same port, at version 0) the following push brings it up to date.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from torch import nn

from dynamo_rl.config.learner import PushConfig
from dynamo_rl.contracts.engine import read_pulse
from dynamo_rl.contracts.weight_control import read_version, weight_protocol
from dynamo_rl.procs import ServiceProcess, free_port
from dynamo_rl.redis_client import sync_client
from dynamo_rl.service_table import SERVICES
from learner.model import load_policy
from learner.push import DistributedPush
from learner.tiny_model import build_tiny_model
from tests.conftest import REPO
from tests.reliability.helpers import frozen, send_signal

pytestmark = pytest.mark.slow

TIMEOUT_S = 120.0  # push.timeout_s: what a stalled push would wait
PROMPT_BOUND_S = 10.0  # the brief: the learner goes on within 10 s of the kill
NS = "dead-engine"  # run.name of the engines that raise pulses


def _engine(model: Path, log: Path, port: int, redis_url: str | None = None) -> ServiceProcess:
    """A real embedded engine; with ``redis_url`` it registers there (namespace ``NS``) and
    raises its pulse."""
    env = {k: v for k, v in os.environ.items() if k != "DYNAMO_CONTROL_TOKEN"}
    env["OMP_NUM_THREADS"] = "1"
    redis = [f"endpoints.redis_url={redis_url}", f"run.name={NS}"] if redis_url else []
    proc, _url = SERVICES["engine"].start(
        log, "--model", str(model), f"engine.weight_update_timeout_s={TIMEOUT_S}", *redis,
        port=port, env=env, cwd=REPO, timeout=180,
    )  # fmt: skip
    return proc


def _signal_when_paused(
    proc: ServiceProcess, url: str, sent: list[float], sig: int = signal.SIGKILL
) -> threading.Thread:
    """``sig`` to the engine once it is paused for a push (its transfer is next); the time in
    ``sent``."""

    def watch() -> None:
        deadline = time.monotonic() + TIMEOUT_S
        with httpx.Client(timeout=5) as http:
            while time.monotonic() < deadline:
                try:
                    if http.get(f"{url}/is_paused").json()["is_paused"]:
                        break
                except httpx.HTTPError:
                    pass
        os.kill(proc.pid, sig)
        sent.append(time.monotonic())

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _two_engines(
    tmp_path: Path, redis_url: str | None = None
) -> tuple[Path, nn.Module, list[int], list[str], list[ServiceProcess], DistributedPush]:
    """A model of ~30M parameters (120 MB float32: a transfer lasts long enough to be cut in the
    middle), two real engines serving it, and a vLLM-shaped push to them. Without ``redis_url``
    the push waits ``silent_s`` 5 s for a silent engine; with it, the engines raise their pulses
    there and the push reads them with the config's defaults (``stopped_s`` 5 s for an engine
    whose pulse stands still, ``silent_s`` 30 s for one whose pulse moves), as the learner does."""
    model_dir = build_tiny_model(tmp_path / "m", hidden_size=512, num_layers=8, num_heads=8,
                                 num_kv_heads=2)  # fmt: skip
    ports = [free_port(), free_port()]
    procs = [_engine(model_dir, tmp_path / f"engine{i}.log", p, redis_url)
             for i, p in enumerate(ports)]  # fmt: skip
    limits: dict = {"silent_s": 5.0}
    if redis_url is not None:
        defaults = PushConfig()
        limits = {"silent_s": defaults.silent_s, "stopped_s": defaults.stopped_s,
                  "pulse": functools.partial(read_pulse, sync_client(redis_url), NS)}  # fmt: skip
    push = DistributedPush(master_address="127.0.0.1", bucket_mb=16.0, timeout_s=TIMEOUT_S,
                           protocol=weight_protocol("vllm"), **limits)  # fmt: skip
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    return model_dir, load_policy(str(model_dir)), ports, urls, procs, push


def test_a_killed_engine_does_not_stall_the_push(tmp_path: Path, one_rank: None) -> None:
    model_dir, policy, ports, urls, procs, push = _two_engines(tmp_path)
    proto = push.protocol
    try:
        first = push.push(policy, 1, urls)
        assert first.ok and not first.failed, first.error
        assert [read_version(proto, u) for u in urls] == [1, 1]

        # kill -9 engine 0 once it is paused for push 2 (its transfer is next).
        killed: list[float] = []
        watcher = _signal_when_paused(procs[0], urls[0], killed)
        second = push.push(policy, 2, urls)
        returned = time.monotonic()
        watcher.join(timeout=5)
        assert killed, "the engine was never seen paused"
        assert procs[0].proc is not None and procs[0].proc.wait(timeout=10) == -signal.SIGKILL
        took = returned - killed[0]
        assert took < PROMPT_BOUND_S, f"the push went on {took:.1f}s after the kill"
        assert second.ok, second.error
        assert second.failed == (urls[0],)
        assert read_version(proto, urls[1]) == 2
        assert not httpx.get(f"{urls[1]}/is_paused").json()["is_paused"]

        # The dead engine is still listed (a kill -9 does not unregister): the next push leaves
        # it out at once.
        t0 = time.monotonic()
        third = push.push(policy, 3, urls)
        assert time.monotonic() - t0 < PROMPT_BOUND_S
        assert third.ok and third.failed == (urls[0],), third.error
        assert "unreachable" in third.error
        assert read_version(proto, urls[1]) == 3

        # Back on its port (a fresh process at version 0): the next push catches it up.
        procs[0] = _engine(model_dir, tmp_path / "engine0-restarted.log", ports[0])
        assert read_version(proto, urls[0]) == 0
        fourth = push.push(policy, 4, urls)
        assert fourth.ok and not fourth.failed, fourth.error
        assert [read_version(proto, u) for u in urls] == [4, 4]
    finally:
        push.close()
        for proc in procs:
            proc.stop()


def test_a_stopped_engine_leaves_the_push_and_catches_up(
    tmp_path: Path, one_rank: None, redis_url: str
) -> None:
    """SIGSTOP, which no socket notices, with the default ``learner.push`` thresholds: the
    engine's pulse in Redis stands still, and it is left out within 10 s by the version read
    that opens the push (stopped before it) or by the push's heartbeat (stopped mid-transfer);
    once continued (SIGCONT) a later push brings it up to date. Without a pulse, one silent for
    less than ``silent_s`` when a push opens (busy, not stopped) takes part in it."""
    _, policy, _, urls, procs, push = _two_engines(tmp_path, redis_url)
    client = sync_client(redis_url)
    deadline = time.monotonic() + 10
    while any(read_pulse(client, NS, url) is None for url in urls):  # both raise their pulses
        assert time.monotonic() < deadline, "an engine raised no pulse in Redis"
        time.sleep(0.1)
    client.close()
    proto = push.protocol
    stopped = procs[0].pid
    try:
        assert push.push(policy, 1, urls).ok
        # Stopped before the push: the opening version read gets no answer.
        with frozen([stopped]):
            t0 = time.monotonic()
            second = push.push(policy, 2, urls)
            took = time.monotonic() - t0
        assert took < PROMPT_BOUND_S, f"the push took {took:.1f}s with a stopped engine"
        print(f"stopped before the push: it returned in {took:.1f}s")
        assert second.ok and second.failed == (urls[0],), second.error
        assert "unreachable" in second.error
        assert read_version(proto, urls[1]) == 2
        # Continued: the next push catches it up.
        third = push.push(policy, 3, urls)
        assert third.ok and not third.failed, third.error
        assert [read_version(proto, u) for u in urls] == [3, 3]

        # Stopped mid-push (paused for the update, its transfer next): the heartbeat leaves it out.
        sent: list[float] = []
        watcher = _signal_when_paused(procs[0], urls[0], sent, signal.SIGSTOP)
        try:
            fourth = push.push(policy, 4, urls)
            returned = time.monotonic()
            watcher.join(timeout=5)
            assert sent, "the engine was never seen paused"
            took = returned - sent[0]
            assert took < PROMPT_BOUND_S, f"the push went on {took:.1f}s after the stop"
            print(f"stopped mid-push: it returned {took:.1f}s after the stop")
            assert fourth.ok and fourth.failed == (urls[0],), fourth.error
            assert "stopped answering" in fourth.error
            assert read_version(proto, urls[1]) == 4
            assert not httpx.get(f"{urls[1]}/is_paused").json()["is_paused"]
        finally:
            send_signal([stopped], signal.SIGCONT)
        # Continued: a later push brings it up to date (the first may still find it busy with
        # the abandoned transfer).
        version, deadline = 4, time.monotonic() + TIMEOUT_S
        while read_version(proto, urls[0]) != version:
            assert time.monotonic() < deadline, "the continued engine was never caught up"
            version += 1
            assert push.push(policy, version, urls).ok
        assert read_version(proto, urls[1]) == version
        assert not httpx.get(f"{urls[0]}/is_paused").json()["is_paused"]
        print(f"caught up at push {version}")

        # Busy, not stopped: an engine silent for less than silent_s when the push opens takes
        # part (a loaded vLLM CPU server can take seconds to answer). A push without pulses
        # (nothing tells this SIGSTOP from a busy server) and silent_s 12 s while engine 0 is
        # stopped for the first 7 s of it.
        push.close()
        push = DistributedPush(master_address="127.0.0.1", bucket_mb=16.0, timeout_s=TIMEOUT_S,
                               protocol=proto, silent_s=12.0)  # fmt: skip
        send_signal([stopped], signal.SIGSTOP)
        wake = threading.Timer(7.0, send_signal, ([stopped], signal.SIGCONT))
        wake.start()
        try:
            version += 1
            slow = push.push(policy, version, urls)
        finally:
            wake.join()
        assert slow.ok and not slow.failed, slow.error
        assert [read_version(proto, u) for u in urls] == [version, version]
    finally:
        send_signal([stopped], signal.SIGCONT)
        push.close()
        for proc in procs:
            proc.stop()
