"""The run-folder history of a service's metrics (``ServiceMetrics.record``, ``run.history``):
the same samples ``/metrics`` exposes, on disk as soon as written, bounded by downsampling, and
written by the real services into ``<run.dir>/metrics``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from dynamo_rl.dashboard.sources import parse_exposition
from dynamo_rl.metrics import History, ServiceMetrics, history_path, read_history
from dynamo_rl.services import SERVICES

REPO = Path(__file__).resolve().parents[2]


def _metrics() -> tuple[ServiceMetrics, object, object, object]:
    m = ServiceMetrics("demo")
    c = m.counter("items_total", "items", ["kind"])
    g = m.gauge("depth", "queue depth")
    h = m.histogram("latency_seconds", "latency", ["route"])
    return m, c, g, h


def _wait(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_snapshot_holds_what_prometheus_exposes(tmp_path: Path) -> None:
    m, c, g, h = _metrics()
    c.labels("a").inc(3)
    c.labels("b").inc()
    g.set(7.5)
    for v in (0.001, 0.2, 4.0):
        h.labels("/v1/verify").observe(v)
    history = History(m, history_path(tmp_path, "demo", "0"), 60.0, 2**20)
    history.write_once()
    (line,) = read_history(history.path)
    assert (line["service"], line["instance"]) == ("demo", "0")
    stored = {(n, tuple(sorted(labels.items()))): v for n, labels, v in line["samples"]}
    exposed = parse_exposition(m.exposition().decode())
    exposed = {k: v for k, v in exposed.items() if not k[0].endswith("_created")}
    assert stored == exposed


def test_downsampling_keeps_the_whole_run_within_the_bound(tmp_path: Path) -> None:
    m, c, _g, _h = _metrics()
    max_bytes = 8192
    history = History(m, tmp_path / "metrics" / "demo-0.jsonl", 1.0, max_bytes)
    for _ in range(400):
        c.labels("a").inc()
        history.write_once()
        assert history.path.stat().st_size <= max_bytes
    lines = read_history(history.path)
    values = [s[2] for line in lines for s in line["samples"] if s[0] == "dynamo_demo_items_total"]
    assert values[0] == 1.0 and values[-1] == 400.0  # the first and the newest snapshot kept
    assert values == sorted(values) and len(values) < 400
    assert history.downsamples >= 1 and history.interval_s == 2.0**history.downsamples


def test_snapshots_survive_a_crash(tmp_path: Path) -> None:
    """Each snapshot is on disk once written: a SIGKILL loses at most the current interval."""
    code = (
        "import sys, time\n"
        "from dynamo_rl.metrics import ServiceMetrics\n"
        "m = ServiceMetrics('demo'); c = m.counter('items_total', 'items')\n"
        f"m.record({str(tmp_path)!r}, 'w1', 0.05, 16)\n"
        "c.inc(42)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        path = tmp_path / "metrics" / "demo-w1.jsonl"

        def has_42() -> bool:
            return any(s[2] == 42.0 for line in read_history(path) for s in line["samples"])

        _wait(has_42, what="a snapshot with the counter at 42")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    for line in path.read_text().splitlines():  # every line complete
        json.loads(line)


def test_the_allocator_writes_its_history_into_the_run_folder(
    tmp_path: Path, redis_server: str
) -> None:
    from allocator.metrics import AllocatorMetrics

    run = tmp_path / "run"
    proc, _addr = SERVICES["allocator"].start(
        tmp_path / "allocator.log", "--redis-url", redis_server, f"run.dir={run}",
        "run.history.interval_s=0.1", "--metrics-port", "0", cwd=REPO,
    )  # fmt: skip
    path = run / "metrics" / "allocator-0.jsonl"
    try:
        _wait(lambda: len(read_history(path)) >= 2, what=str(path))
    finally:
        assert proc.stop() == 0
    lines = read_history(path)
    names = {s[0] for s in lines[-1]["samples"]}
    assert names and names <= AllocatorMetrics().metrics.names()
    assert lines[-1]["service"] == "allocator"
