"""The harness itself: real Redis, service processes that are waited for and cleaned up."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from dynamo_rl.keys import stats_key, trajectory_stream
from dynamo_rl.metrics import ServiceMetrics
from dynamo_rl.procs import ServiceProcess, http_ok


def test_redis_fixture_is_real_and_empty(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    assert client.dbsize() == 0
    client.hincrby("h", "f", 2)
    assert client.hget("h", "f") == b"2"
    assert client.info("server")["tcp_port"] > 0


def test_service_waits_for_health_and_stops_group(service, free_port: int, tmp_path) -> None:
    # A server that also leaves a child behind: stop() must kill the whole group.
    pidfile = tmp_path / "child.pid"
    code = (
        "import http.server, subprocess, sys\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
        f"http.server.HTTPServer(('127.0.0.1', {free_port}), http.server.SimpleHTTPRequestHandler)"
        ".serve_forever()\n"
    )
    proc = service("web", [sys.executable, "-c", code], http_ok(f"http://127.0.0.1:{free_port}/"))
    assert proc.alive()
    child = int(pidfile.read_text())
    proc.stop(grace=5)
    assert not proc.alive()
    # The kill is delivered at once but a loaded machine may take a moment to run it.
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child)


def _running(pid: int) -> bool:
    """True unless the process is gone or a zombie (killed, waiting to be reaped by init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_dead_service_fails_fast_with_its_log(tmp_path) -> None:
    code = "import sys; print('boom: bad flag'); sys.exit(3)"
    proc = ServiceProcess("bad", [sys.executable, "-c", code], tmp_path / "bad.log").start()
    with pytest.raises(RuntimeError, match="boom: bad flag"):
        proc.wait_ready(lambda: False, timeout=30)
    proc.stop()


def test_keys_are_namespaced_and_checked() -> None:
    assert stats_key("exp") == "dynamo:stats:exp"
    assert trajectory_stream("exp") != trajectory_stream("other")
    with pytest.raises(ValueError, match="namespace"):
        stats_key("")
    with pytest.raises(ValueError, match="namespace"):
        stats_key("a b")


def test_metrics_helper_names() -> None:
    m = ServiceMetrics("reward")
    m.counter("requests_total", "requests", ["kind"]).labels("math").inc()
    m.histogram("latency_seconds", "latency").observe(0.01)
    assert "dynamo_reward_requests_total" in m.names()
    assert "dynamo_reward_latency_seconds_bucket" in m.names()
    assert b"dynamo_reward_requests_total" in m.exposition()
    with pytest.raises(ValueError, match="_total"):
        m.counter("requests", "x")
    with pytest.raises(ValueError):
        ServiceMetrics("Bad-Name")


def _signal_recorder(tmp_path, name: str, exit_on_signal: bool) -> tuple[ServiceProcess, Path]:
    """A process that writes the number of each SIGTERM, SIGINT or SIGHUP it gets to a file, and
    exits 0 on the first one (``exit_on_signal``) or goes on sleeping; the process and the file."""
    record = tmp_path / f"{name}.signals"
    code = (
        "import signal, sys, time\n"
        "def got(signum, _frame):\n"
        f"    with open({str(record)!r}, 'a') as f:\n"
        "        f.write(f'{signum}\\n')\n"
        f"    if {exit_on_signal!r}:\n"
        "        sys.exit(0)\n"
        "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
        "    signal.signal(s, got)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = ServiceProcess(name, [sys.executable, "-c", code], tmp_path / f"{name}.log").start()
    proc.wait_ready(lambda: "ready" in proc.log_tail(), timeout=30)
    return proc, record


def _received(record: Path) -> list[int]:
    return [int(x) for x in record.read_text().split()] if record.exists() else []


def test_sigterm_is_used_before_sigkill(tmp_path) -> None:
    """``stop`` sends SIGTERM first (not another signal a service might also handle gracefully),
    and SIGKILL only to a process still running after the grace."""
    graceful, record = _signal_recorder(tmp_path, "graceful", exit_on_signal=True)
    assert graceful.stop(grace=10) == 0
    assert _received(record) == [signal.SIGTERM]
    stubborn, record = _signal_recorder(tmp_path, "stubborn", exit_on_signal=False)
    start = time.monotonic()
    assert stubborn.stop(grace=2) == -signal.SIGKILL
    assert time.monotonic() - start >= 2  # the grace was given
    assert _received(record) == [signal.SIGTERM]


def test_metrics_names_include_unused_labelled_metrics() -> None:
    m = ServiceMetrics("engine")
    m.counter("errors_total", "errors", ["kind"])
    m.histogram("wait_seconds", "waits", ["why"])
    names = m.names()
    assert {"dynamo_engine_errors_total", "dynamo_engine_wait_seconds_bucket"} <= names


def test_free_port_never_hands_out_the_same_port_twice() -> None:
    """``up`` picks every port before starting anything: a repeat would make two services collide
    (it did: Redis and the reward service were once given the same port)."""
    from dynamo_rl.procs import free_port

    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)


def test_free_port_is_below_the_ephemeral_range_so_port_0_binds_never_take_it() -> None:
    """A picked port waits for its service while other processes bind port 0 (metrics servers) and
    open connections: in CI the allocator's metrics server was given the port ``up`` had picked for
    the reward service, which then could not bind it. Picks lie below the kernel's ephemeral range,
    and a thousand port-0 binds held at once never land on one."""
    import socket

    from dynamo_rl.procs import LOWEST_PICK, ephemeral_range, free_port

    lo, hi = ephemeral_range()
    assert 1024 <= lo <= hi
    picked = {free_port() for _ in range(200)}
    assert all(LOWEST_PICK <= p < lo for p in picked)
    socks = []
    try:
        for _ in range(1000):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        taken = {s.getsockname()[1] for s in socks}
    finally:
        for s in socks:
            s.close()
    assert all(lo <= p <= hi for p in taken)
    assert not taken & picked


def test_free_port_skips_a_port_in_use(monkeypatch) -> None:
    """The pick is checked by binding it: a port some process listens on is never handed out."""
    import socket

    from dynamo_rl import procs

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", procs.LOWEST_PICK + 5))
        busy.listen()
        draws = iter([5, 5, 6])
        monkeypatch.setattr(procs.secrets, "randbelow", lambda _n: next(draws))
        monkeypatch.setattr(procs, "_handed_out", set())
        assert procs.free_port() == procs.LOWEST_PICK + 6


def test_a_metrics_port_answers_only_metrics() -> None:
    """A readiness probe that reaches a metrics server (another service given the port) must not
    pass: ``/metrics`` answers, every other path is 404 (the reward service's ``/healthz`` passed
    against the allocator's metrics server once, and ``up`` went on without a reward service)."""
    import httpx

    m = ServiceMetrics("allocator")
    m.counter("calls_total", "calls").inc()
    port = m.serve(0)
    base = f"http://127.0.0.1:{port}"
    ok = httpx.get(f"{base}/metrics", timeout=5)
    assert ok.status_code == 200 and "dynamo_allocator_calls_total 1.0" in ok.text
    for path in ("/healthz", "/health", "/", "/metrics/x"):
        assert httpx.get(base + path, timeout=5).status_code == 404, path
