"""Telling a stopped engine from a busy one in a push: the engine pulse (``EnginePulse`` writes
it, ``read_pulse`` reads it, through a real Redis server) and the learner's ``Heartbeat`` against a
real HTTP server whose ``GET /health`` hangs, and the vLLM launcher's view of a stopped process.

A busy engine answers HTTP late but its pulse moves: it is waited for ``silent_s``. A stopped one
answers nothing and its pulse stands still: it is left out after ``stopped_s``. One without a
pulse is judged by ``silent_s`` alone.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from dynamo_rl.config.learner import PushConfig
from dynamo_rl.contracts.engine import PULSE_TTL_S, EnginePulse, read_pulse
from dynamo_rl.contracts.weight_control import weight_protocol
from dynamo_rl.keys import engine_pulse_key
from dynamo_rl.redis_client import sync_client
from learner.engine_links import Heartbeat
from services.engine.vllm_server import tree_running
from tests.reliability.helpers import frozen, process_tree, send_signal

NS = "pulse-test"
URL = "http://10.0.0.7:8000"


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``cond`` held (fails after ``timeout_s``)."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s}s"
        time.sleep(0.05)
    return time.monotonic() - t0


def holds_for(cond: Callable[[], bool], seconds: float) -> bool:
    """Whether ``cond`` holds at every look for ``seconds``."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if not cond():
            return False
        time.sleep(0.05)
    return True


@contextlib.contextmanager
def health_server() -> Iterator[tuple[str, threading.Event]]:
    """A real HTTP server answering ``GET /health``; while the event is set, it answers nothing
    (the request waits until it is cleared)."""
    hung = threading.Event()

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            while hung.is_set():
                time.sleep(0.05)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hung
    finally:
        hung.clear()
        server.shutdown()
        server.server_close()


def test_the_pulse_moves_while_running_stands_still_otherwise_and_is_removed(
    redis_url: str,
) -> None:
    client = sync_client(redis_url)
    running = threading.Event()
    running.set()
    pulse = EnginePulse(redis_url, NS, URL + "/", running.is_set).start()
    try:
        assert read_pulse(client, NS, "http://10.0.0.8:8000") is None  # no such engine
        wait_for(lambda: (read_pulse(client, NS, URL) or 0) >= 2, 10, "two pulses")
        assert 0 < client.ttl(engine_pulse_key(NS, URL)) <= PULSE_TTL_S  # a pulse left expires
        running.clear()
        # A raise already under way may still land: from the first two reads 1.5 s apart that
        # agree, the pulse must stand still for two more pulses' time.
        deadline = time.monotonic() + 10
        while True:
            still = read_pulse(client, NS, URL)
            if holds_for(lambda v=still: read_pulse(client, NS, URL) == v, 1.5):
                break
            assert time.monotonic() < deadline, "the pulse kept moving while not running"
        assert holds_for(lambda: read_pulse(client, NS, URL) == still, 2.5)
        running.set()
        wait_for(lambda: (read_pulse(client, NS, URL) or 0) > (still or 0), 5, "the pulse again")
    finally:
        pulse.stop()
    assert not client.exists(engine_pulse_key(NS, URL))
    client.close()


def _pulse_of(redis_url: str, running: Callable[[], bool]) -> tuple[EnginePulse, Callable]:
    client = sync_client(redis_url)
    pulse = EnginePulse(redis_url, NS, URL, running).start()
    wait_for(lambda: read_pulse(client, NS, URL) is not None, 10, "the first pulse")
    return pulse, lambda: read_pulse(client, NS, URL)


@pytest.mark.parametrize("case", ["busy", "stopped", "no pulse"])
def test_heartbeat_tells_a_stopped_engine_from_a_busy_one(redis_url: str, case: str) -> None:
    stopped_s, silent_s = 3.0, 8.0  # stopped_s' least allowed value
    running = threading.Event()
    running.set()
    pulse, reader = _pulse_of(redis_url, running.is_set) if case != "no pulse" else (None, None)
    with health_server() as (url, hung):
        beat = Heartbeat(url, weight_protocol("vllm"), {}, silent_s, stopped_s, reader)
        try:
            assert holds_for(lambda: not beat.silent, 1.0)  # answering: never silent
            hung.set()  # from now on GET /health waits
            if case == "stopped":  # as a SIGSTOP does: HTTP and the pulse stop together
                running.clear()
            took = wait_for(lambda: beat.silent, silent_s + 5, "silent")
            if case == "stopped":  # no answer and a still pulse: stopped_s (plus two beats)
                assert took < stopped_s + 3, f"a stopped engine was silent only after {took:.1f}s"
            else:  # busy (its pulse moves) or unknown: waited for silent_s
                assert took > silent_s - 1.5, f"a {case} engine was silent after {took:.1f}s"
            hung.clear()
            wait_for(lambda: not beat.silent, 5, "answering again")
        finally:
            beat.stop()
            if pulse is not None:
                pulse.stop()


def test_a_push_config_bounds_stopped_s() -> None:
    with pytest.raises(ValidationError, match="stopped_s"):
        PushConfig(silent_s=4.0, stopped_s=5.0)
    with pytest.raises(ValidationError, match="stopped_s"):
        PushConfig(stopped_s=2.0)  # under three pulses
    assert PushConfig(silent_s=4.0).stopped_s == 4.0  # the default follows a smaller silent_s


def test_tree_running_sees_a_stopped_descendant_and_nothing_else() -> None:
    """The vLLM launcher's pulse stands still while a process under it is stopped (vLLM's API
    server, its engine core), not while some other process is."""
    shell = subprocess.Popen(["sh", "-c", "sleep 60; :"])  # sh waits on its child sleep
    other = subprocess.Popen(["sleep", "60"])  # not under the shell
    try:
        wait_for(lambda: len(process_tree(shell.pid)) == 2, 5, "the shell's child")
        [_, child] = process_tree(shell.pid)
        send_signal([other.pid], signal.SIGSTOP)
        wait_for(lambda: Path(f"/proc/{other.pid}/stat").read_text().split(")")[1].split()[0]
                 == "T", 5, "the other process stopped")  # fmt: skip
        assert tree_running(shell.pid), "a stopped process outside the tree stilled the pulse"
        with frozen([child]):
            wait_for(lambda: not tree_running(shell.pid), 5, "the stopped descendant seen")
        wait_for(lambda: tree_running(shell.pid), 5, "seen running again")
    finally:
        send_signal([other.pid], signal.SIGCONT)
        for proc in (shell, other):
            proc.kill()
            proc.wait()
