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

from dashboard.sources import parse_exposition
from dynamo_rl.metrics import History, ServiceMetrics, history_path, read_history
from dynamo_rl.service_table import SERVICES

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


def test_a_scraped_target_is_recorded_in_the_same_schema(tmp_path: Path) -> None:
    """A process that is not ours (a vLLM server) is recorded by scraping its ``/metrics`` (here
    a real Prometheus HTTP server): the line holds exactly what it exposes, plus the extra
    samples; a target that is down writes no line."""
    from dashboard.charts import CHARTS
    from dashboard.sources import JsonlLog, RunFolder, Scraper, chart_data
    from dynamo_rl.metrics import ScrapedMetrics
    from dynamo_rl.procs import free_port

    m, c, g, _h = _metrics()
    port = m.serve(0)
    scraped = ScrapedMetrics("demo", f"http://127.0.0.1:{port}/metrics",
                             extra=lambda: [["dynamo_engine_weight_version", {}, 3.0]])  # fmt: skip
    history = History(scraped, history_path(tmp_path, "demo", "7"), 60.0, 2**20)
    c.labels("a").inc(2)
    g.set(4.0)
    history.write_once()
    (line,) = read_history(history.path)
    stored = {(n, tuple(sorted(labels.items()))): v for n, labels, v in line["samples"]}
    exposed = parse_exposition(m.exposition().decode())
    exposed = {k: v for k, v in exposed.items() if not k[0].endswith("_created")}
    assert stored == {**exposed, ("dynamo_engine_weight_version", ()): 3.0}
    assert line["service"] == "demo" and line["instance"] == "7"

    down = ScrapedMetrics("demo", f"http://127.0.0.1:{free_port()}/metrics", timeout_s=1.0)
    History(down, history_path(tmp_path, "demo", "8"), 60.0, 2**20).write_once()
    assert not history_path(tmp_path, "demo", "8").exists() and down.failures == 1

    # vLLM's own names (colons included) survive the round trip and draw the engine charts.
    vllm = ServiceMetrics("demo")
    vllm.registry.register(_VLLMLike())
    vport = vllm.serve(0)
    recorder = ScrapedMetrics("engine", f"http://127.0.0.1:{vport}/metrics",
                              extra=lambda: [["dynamo_engine_weight_version", {}, 1.0]])  # fmt: skip
    vhist = History(recorder, history_path(tmp_path, "engine", "8001"), 60.0, 2**20)
    for _ in range(3):
        _VLLMLike.tokens += 50
        vhist.write_once()
        time.sleep(0.01)
    run = RunFolder(tmp_path)
    run.refresh()
    by_id = {ch.id: ch for ch in CHARTS}

    class Folder(Scraper):  # the run folder's snapshots, as the dashboard draws them
        def snapshots(self):  # type: ignore[override]
            return [(k, v) for k, v in run.snapshots() if k.startswith("engine")]

    lines = {i: chart_data(by_id[i], JsonlLog(None), Folder([]))["lines"]
             for i in ("tokens", "engine_batch", "engine_weights")}  # fmt: skip
    assert [ln["label"] for ln in lines["tokens"]] == ["engine-8001"]
    assert len(lines["tokens"][0]["points"]) == 2 and lines["tokens"][0]["points"][0][1] > 0
    assert [p[1] for p in lines["engine_batch"][0]["points"]] == [5.0, 5.0, 5.0]
    assert [p[1] for p in lines["engine_weights"][0]["points"]] == [1.0, 1.0, 1.0]


class _VLLMLike:
    """A collector exposing two of vLLM's series under vLLM's names (``vllm:...``)."""

    tokens = 0.0

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        gen = CounterMetricFamily("vllm:generation_tokens", "tokens", labels=["engine"])
        gen.add_metric(["0"], _VLLMLike.tokens)
        running = GaugeMetricFamily("vllm:num_requests_running", "running", labels=["engine"])
        running.add_metric(["0"], 5.0)
        return [gen, running]


def test_record_run_follows_the_run_section(tmp_path: Path) -> None:
    from dynamo_rl.config.common import RunConfig

    m, c, _g, _h = _metrics()
    c.labels("a").inc()
    run = RunConfig(dir=str(tmp_path / "{name}"), name="r1")
    off = run.model_copy(update={"history": run.history.model_copy(update={"interval_s": 0})})
    assert m.record_run(off, "w0") is None
    history = m.record_run(run, "w0")
    assert history is not None
    history.stop()
    path = history_path(tmp_path / "r1", "demo", "w0")
    assert history.path == path and history.interval_s == run.history.interval_s
    assert read_history(path)[-1]["samples"]
