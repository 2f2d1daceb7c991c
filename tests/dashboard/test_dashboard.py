"""The built-in dashboard: its data sources, its routes, and its metric names against the code."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dashboard.advantages import group_advantages
from dashboard.charts import CHARTS, Chart, Series, jsonl_fields, metric_names
from dashboard.cli import default_targets
from dashboard.server import Dashboard, make_server, serve_in_thread
from dashboard.sources import (
    JsonlLog,
    SampleFilter,
    SampleReader,
    Scraper,
    Snapshot,
    chart_data,
    parse_exposition,
)
from dynamo_rl.config import load_config
from dynamo_rl.contracts.step_allocation import StepAllocation
from dynamo_rl.metrics import ServiceMetrics
from tests.dashboard.dashboard_data import write_metrics_log, write_stream
from tests.deploy.registry import METRIC_CLASSES, service_of, service_registry

# --- metric names -----------------------------------------------------------------------------


@pytest.mark.parametrize("service", sorted(METRIC_CLASSES))
def test_chart_metrics_exist_in_the_service_registry(service: str) -> None:
    ours = {m for m in metric_names() if not m.startswith("vllm:")}
    wanted = {m for m in ours if service_of(m) == service}
    reg = service_registry(service)  # fails, never skips, when the registry is not there
    assert reg.names, f"the {service} registry exposes nothing"
    assert wanted <= reg.names, f"not in the {service} registry: {sorted(wanted - reg.names)}"


def test_every_chart_metric_names_a_known_service() -> None:
    from dynamo_rl.metrics import VLLM_SERIES

    for name in metric_names():
        if name.startswith("vllm:"):  # a vLLM engine's own series (checked in tests/vllm)
            assert name in VLLM_SERIES, name
            continue
        service_of(name)  # raises on a name outside dynamo_<service>_


def test_jsonl_fields_are_keys_the_learner_writes() -> None:
    import learner.metrics as learner_metrics

    written = set(learner_metrics.GAUGES) | {f"time_{p}" for p in learner_metrics.PHASES}
    lags = {f"{learner_metrics.LAG_PREFIX}{k}": str(k) for k in range(8)}
    assert jsonl_fields() <= written | set(lags), sorted(jsonl_fields() - written - set(lags))
    # A field and the gauge it stands for when the log is missing must be the same quantity.
    for chart in CHARTS:
        for s in chart.series:
            if s.field in learner_metrics.GAUGES:
                assert s.metric == f"dynamo_learner_{s.field}", s
            if s.field in lags:
                assert s.metric == "dynamo_learner_mismatch_kl_by_lag", s
                assert s.labels == {"lag": lags[s.field]}, s


def test_a_chart_does_not_mix_log_lines_and_scraped_lines() -> None:
    for chart in CHARTS:
        assert len({s.field is None for s in chart.series}) == 1, chart.id
        # A bar chart draws histograms, and counts as bars of their own ("value").
        bars_ok = all(s.how in ("buckets", "value") for s in chart.series)
        assert chart.kind == "line" or bars_ok, chart.id


def test_names_helper_sees_labelled_metrics_before_first_use() -> None:
    m = ServiceMetrics("testsvc")
    m.counter("errors_total", "errors", ["kind"])
    m.histogram("step_seconds", "step", ["phase"])
    from tests.deploy.registry import exposed_names

    names = exposed_names(m)
    assert {"dynamo_testsvc_errors_total", "dynamo_testsvc_step_seconds_bucket"} <= names
    assert "dynamo_testsvc_errors_totl" not in names


# --- sources ----------------------------------------------------------------------------------


def test_jsonl_log_reads_appended_lines_only_and_survives_partial_and_bad_lines(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    log = JsonlLog(path)
    log.refresh()  # not there yet: nothing, no error
    assert log.points("loss") == []
    path.write_text('{"step": 1, "loss": 0.5}\nnot json\n{"step": 2, "loss": 0.4')
    log.refresh()
    assert log.points("loss") == [[1.0, 0.5]]  # the half-written line waits
    assert log.bad_lines == 1
    with open(path, "a") as f:
        f.write(', "kl": NaN}\n{"step": 3, "loss": 0.3, "flag": true}\n')
    log.refresh()
    assert log.points("loss") == [[1.0, 0.5], [2.0, 0.4], [3.0, 0.3]]
    assert log.points("kl") == []  # NaN is skipped
    assert log.points("flag") == []  # booleans are not numbers here
    path.write_text('{"step": 7, "loss": 0.1}\n')  # replaced by a shorter file: start over
    log.refresh()
    assert log.points("loss") == [[7.0, 0.1]]


def test_jsonl_log_reads_the_learners_own_step_log(tmp_path: Path) -> None:
    import learner.steplog as steplog

    writer = steplog.StepLog(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        writer.write({"step": step, "loss": 1.0 / step, "reward_mean": 0.25 * step})
    log = JsonlLog(tmp_path / "metrics.jsonl")
    log.refresh()
    assert log.points("loss") == [[1.0, 1.0], [2.0, 0.5]]
    assert log.points("reward_mean") == [[1.0, 0.25], [2.0, 0.5]]


def test_staleness_chart_shows_the_version_spread_within_responses(tmp_path: Path) -> None:
    import learner.steplog as steplog

    writer = steplog.StepLog(tmp_path / "metrics.jsonl")
    for step, spread in ((1, 0), (2, 2)):
        writer.write({"step": step, "staleness_mean": 0.5, "staleness_max": 1 + spread,
                      "version_spread_mean": spread / 4, "version_spread_max": spread})  # fmt: skip
    log = JsonlLog(tmp_path / "metrics.jsonl")
    log.refresh()
    (chart,) = [c for c in CHARTS if c.id == "staleness"]
    lines = {ln["label"]: ln["points"] for ln in chart_data(chart, log, Scraper([]))["lines"]}
    assert lines["spread in a response (max)"] == [[1.0, 0.0], [2.0, 2.0]]
    assert lines["spread in a response (mean)"] == [[1.0, 0.0], [2.0, 0.5]]
    assert lines["oldest token"] == [[1.0, 1.0], [2.0, 3.0]]


def test_allocation_chart_draws_a_steps_allocation_from_its_record(tmp_path: Path) -> None:
    """The chart of prompts above, at and below uniform n and skipped: from the learner's step
    log when there is one, else from the learner's gauges the same record set."""
    import learner.steplog as steplog
    from learner.metrics import LearnerMetrics

    steps = {1: StepAllocation(above=3, at=4, below=1, skipped=2), 2: StepAllocation(at=8)}
    writer = steplog.StepLog(tmp_path / "metrics.jsonl")
    for step, allocation in steps.items():
        writer.write({"step": step, "loss": 0.1, **allocation.record()})
    log = JsonlLog(tmp_path / "metrics.jsonl")
    log.refresh()
    (chart,) = [c for c in CHARTS if c.id == "alloc_vs_uniform"]
    assert chart.group == "allocation" and chart.unit == "prompts"
    lines = {ln["label"]: ln["points"] for ln in chart_data(chart, log, Scraper([]))["lines"]}
    assert lines == {
        "above uniform": [[1.0, 3.0], [2.0, 0.0]],
        "at uniform": [[1.0, 4.0], [2.0, 8.0]],
        "below uniform": [[1.0, 1.0], [2.0, 0.0]],
        "skipped": [[1.0, 2.0], [2.0, 0.0]],
    }
    metrics = LearnerMetrics()
    snaps = _snapshots(metrics.metrics, [(50.0, lambda: metrics.record_step(
        {"step": 1, **steps[1].record()}))])  # fmt: skip
    out = chart_data(chart, JsonlLog(None), _FixedScraper({"http://l:1/metrics": snaps}))
    scraped = {ln["label"]: ln["points"] for ln in out["lines"]}
    assert scraped == {"above uniform": [[50.0, 3.0]], "at uniform": [[50.0, 4.0]],
                       "below uniform": [[50.0, 1.0]], "skipped": [[50.0, 2.0]]}  # fmt: skip


def _snapshots(m: ServiceMetrics, steps: list[tuple[float, callable]]) -> list[Snapshot]:
    out = []
    for t, change in steps:
        change()
        out.append(Snapshot(t, parse_exposition(m.exposition().decode())))
    return out


class _FixedScraper(Scraper):
    def __init__(self, snaps: dict[str, list[Snapshot]]) -> None:
        super().__init__(list(snaps), interval=1.0)
        self._fixed = snaps

    def snapshots(self) -> list[tuple[str, list[Snapshot]]]:
        return list(self._fixed.items())


def test_rates_ratios_values_and_buckets_from_real_expositions(tmp_path: Path) -> None:
    m = ServiceMetrics("rollout")
    groups = m.counter("groups_total", "g")
    depth = m.gauge("pending_groups", "p")
    phase = m.histogram("phase_seconds", "p", ["phase"], buckets=(0.5, 1, 2))
    alloc = m.histogram("allocation_count", "a", buckets=(2, 4, 8, 16))
    for n in (4, 4, 8, 16, 16, 16):
        alloc.observe(n)

    def step(k: int):
        def change() -> None:
            groups.inc(10 * k)
            depth.set(k)
            phase.labels("train").observe(0.25 * k)
            phase.labels("data").observe(1.5)

        return change

    snaps = _snapshots(m, [(100.0, step(1)), (102.0, step(2)), (104.0, step(3))])
    # A restart resets the counter: that interval must not show a negative rate.
    restarted = ServiceMetrics("rollout")
    restarted.counter("groups_total", "g").inc(1)
    snaps.append(Snapshot(106.0, parse_exposition(restarted.exposition().decode())))
    scraper = _FixedScraper({"http://a:1/metrics": snaps})
    log = JsonlLog(None)

    def lines(series: Series, kind: str = "line") -> dict:
        return chart_data(Chart("c", "c", "g", "", (series,), kind=kind), log, scraper)

    rate = lines(Series("g", "dynamo_rollout_groups_total", how="rate"))["lines"][0]["points"]
    assert rate == [[102.0, 10.0], [104.0, 15.0]]  # +20 over 2 s, +30 over 2 s; reset skipped
    value = lines(Series("d", "dynamo_rollout_pending_groups"))["lines"][0]["points"]
    assert [p[1] for p in value] == [1.0, 2.0, 3.0]
    ratio = lines(
        Series(
            "t",
            "dynamo_rollout_phase_seconds_sum",
            how="ratio",
            per="dynamo_rollout_phase_seconds_count",
            labels={"phase": "train"},
        )
    )["lines"][0]["points"]
    assert ratio == [[102.0, 0.5], [104.0, 0.75]]
    bars = lines(Series("a", "dynamo_rollout_allocation_count_bucket", how="buckets"), "bars")
    # The last snapshot is the restarted registry without the histogram: no bars, not stale ones.
    assert bars["bars"] == []
    scraper._fixed = {"http://a:1/metrics": snaps[:3]}
    bars = lines(Series("a", "dynamo_rollout_allocation_count_bucket", how="buckets"), "bars")
    assert bars["bars"] == [
        {"label": "≤4", "value": 2.0},
        {"label": "≤8", "value": 1.0},
        {"label": "≤16", "value": 3.0},
    ]
    # A value series in a bar chart is a bar of its own, first (the priority chart's
    # "exploring" count beside the histogram); a zero count draws no bar.
    two = (Series("exploring", "dynamo_rollout_pending_groups"),
           Series("a", "dynamo_rollout_allocation_count_bucket", how="buckets"))  # fmt: skip
    both = chart_data(Chart("c", "c", "g", "", two, kind="bars"), log, scraper)["bars"]
    assert both[0] == {"label": "exploring", "value": 3.0} and both[1:] == bars["bars"]
    depth.set(0)
    scraper._fixed = {"http://a:1/metrics": [*snaps[:2], _snapshots(m, [(105.0, lambda: None)])[0]]}
    both = chart_data(Chart("c", "c", "g", "", two, kind="bars"), log, scraper)["bars"]
    assert [b["label"] for b in both] == ["≤4", "≤8", "≤16"]


def test_split_by_target_draws_one_line_per_engine() -> None:
    def engine(tokens: list[int]) -> list[Snapshot]:
        m = ServiceMetrics("engine")
        c = m.counter("generated_tokens_total", "t")
        return _snapshots(m, [(100.0 + i, lambda n=n: c.inc(n)) for i, n in enumerate(tokens)])

    scraper = _FixedScraper(
        {"http://e0:8000/metrics": engine([5, 10, 10]), "http://e1:8000/metrics": engine([1, 1, 1])}
    )
    series = Series("e", "dynamo_engine_generated_tokens_total", how="rate", split="target")
    out = chart_data(Chart("t", "t", "g", "", (series,)), JsonlLog(None), scraper)
    assert {line["label"]: [p[1] for p in line["points"]] for line in out["lines"]} == {
        "e0:8000": [10.0, 10.0],
        "e1:8000": [1.0, 1.0],
    }


def test_log_field_wins_over_the_scrape_and_the_scrape_fills_in(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 5, "loss": 0.25}\n')
    log = JsonlLog(path)
    log.refresh()
    m = ServiceMetrics("learner")
    g = m.gauge("loss", "l")
    snaps = _snapshots(m, [(100.0, lambda: g.set(9.0))])
    chart = Chart("l", "l", "g", "", (Series("loss", "dynamo_learner_loss", field="loss"),))
    out = chart_data(chart, log, _FixedScraper({"http://l:1/metrics": snaps}))
    assert out["lines"] == [{"label": "loss", "x": "step", "points": [[5.0, 0.25]]}]
    out = chart_data(chart, JsonlLog(None), _FixedScraper({"http://l:1/metrics": snaps}))
    assert out["lines"] == [{"label": "loss", "x": "time", "points": [[100.0, 9.0]]}]


def test_scraper_records_errors_and_recovers(free_port: int) -> None:
    scraper = Scraper([f"http://127.0.0.1:{free_port}/metrics"], interval=0.2)
    scraper.scrape_once()
    (status,) = scraper.status()
    assert not status["ok"] and "Error" in status["error"]


def test_sample_filter_parses_and_rejects() -> None:
    flt = SampleFilter.from_query(
        {"source": ["gsm8k"], "min_reward": ["0.5"], "correct": ["true"], "limit": ["5000"]}
    )
    assert (flt.source, flt.min_reward, flt.correct, flt.limit) == ("gsm8k", 0.5, True, 1000)
    for bad in ({"min_reward": ["x"]}, {"max_reward": ["nan"]}, {"correct": ["maybe"]}):
        with pytest.raises(ValueError):
            SampleFilter.from_query(bad)


def test_default_targets_follow_the_config() -> None:
    cfg = load_config(
        None,
        [
            "endpoints.engine_urls=[http://e0:8000, http://e1:8000/]",
            "endpoints.reward_url=http://reward:8080",
            "endpoints.allocator_addr=allocator:50051",
        ],
        env={},
    )
    urls = default_targets(cfg)
    assert urls[:3] == [
        "http://e0:8000/metrics",
        "http://e1:8000/metrics",
        "http://reward:8080/metrics",
    ]
    assert f"http://allocator:{cfg.allocator.metrics_port}/metrics" in urls
    assert f"http://127.0.0.1:{cfg.rollout.metrics_port}/metrics" in urls


# --- the server -------------------------------------------------------------------------------


@pytest.fixture
def dashboard_url(redis_url: str, tmp_path: Path) -> Iterator[str]:
    write_stream(redis_url, "exp1")
    write_metrics_log(tmp_path / "metrics.jsonl", steps=10)
    dashboard = Dashboard(
        log=JsonlLog(tmp_path / "metrics.jsonl"),
        scraper=Scraper([]),
        samples=SampleReader(redis_url, "exp1"),
        run_name="exp1",
    )
    server = make_server(dashboard, "127.0.0.1", 0)
    serve_in_thread(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        dashboard.samples.close()


def test_pages_and_script_are_served_from_the_package(dashboard_url: str) -> None:
    for path, marker in (
        ("/", 'data-page="charts"'),
        ("/samples", 'data-page="samples"'),
        ("/static/dashboard.js", "function lineChart"),
        ("/static/dashboard.css", "header .status"),
    ):
        r = httpx.get(dashboard_url + path)
        assert r.status_code == 200 and marker in r.text, path
        assert "default-src 'self'" in r.headers["content-security-policy"]
    # Nothing on the pages comes from another origin (there is no internet where it runs).
    for path in ("/", "/samples", "/static/dashboard.js", "/static/dashboard.css"):
        assert "http://" not in httpx.get(dashboard_url + path).text.replace(
            "http://www.w3.org/2000/svg", ""
        )
    assert httpx.get(dashboard_url + "/static/../cli.py").status_code == 404
    assert httpx.get(dashboard_url + "/healthz").json() == {"ok": True}


def test_api_charts_has_log_lines_and_stream_allocation(dashboard_url: str) -> None:
    data = httpx.get(dashboard_url + "/api/charts").json()
    charts = {c["id"]: c for c in data["charts"]}
    assert set(charts) == {c.id for c in CHARTS} | {"stream_alloc", "stream_half_solved"} | {
        "zero_advantage",
        "prompt_success",
        "prompt_alloc",
        "prompt_priority",
    }
    reward = charts["reward"]["lines"]
    assert [line["label"] for line in reward] == ["reward mean", "accuracy"]
    assert [p[0] for p in reward[0]["points"]] == [float(s) for s in range(1, 11)]
    assert charts["step_split"]["lines"][0]["x"] == "step"
    # A distilling run's reverse KL to its teacher, beside the other KLs.
    (teacher_kl,) = [ln for ln in charts["kl"]["lines"] if ln["label"] == "reverse KL to teacher"]
    assert [p[1] for p in teacher_kl["points"]] == [0.5 / s for s in range(1, 11)]
    # 12 groups with counts 4, 8, 12, 16 in turn.
    assert charts["stream_alloc"]["bars"] == [
        {"label": str(n), "value": 3.0} for n in (4, 8, 12, 16)
    ]
    # Per version (g // 4), the share of responses in groups with accuracy in [0.25, 0.75].
    (half,) = charts["stream_half_solved"]["lines"]
    assert [p[0] for p in half["points"]] == [0.0, 1.0, 2.0]
    assert all(0.0 <= p[1] <= 1.0 for p in half["points"])
    assert data["sources"]["metrics_log"]["records"] == 10
    assert data["sources"]["redis"] == {"configured": True, "ok": True}


def test_api_samples_rows_and_filters(dashboard_url: str, redis_url: str) -> None:
    data = httpx.get(dashboard_url + "/api/samples", params={"limit": 1000}).json()
    assert data["sources"] == ["arith", "gsm8k"]
    assert data["stream_length"] == 12 and data["weight_version"] == 3
    assert len(data["rows"]) == sum((4, 8, 12, 16)) * 3
    newest = data["rows"][0]
    assert newest["prompt_id"] == "p011" and newest["allocated_n"] == 16
    assert newest["prompt"] == "What is 11 + 3?"
    # Advantages are group-normalised: they sum to ~0 within a group.
    group = [r for r in data["rows"] if r["prompt_id"] == "p011"]
    assert abs(sum(r["advantage"] for r in group)) < 1e-6
    assert len({r["correct"] for r in group}) == 2  # a mixed group: signs follow correctness
    assert all((r["advantage"] > 0) == r["correct"] for r in group)
    # The default estimator is GRPO's, with the unbiased std the learner divides by.
    group.sort(key=lambda r: r["index"])
    want = group_advantages([r["reward"] for r in group], "grpo")
    assert [r["advantage"] for r in group] == pytest.approx(want, rel=1e-9)

    only = httpx.get(
        dashboard_url + "/api/samples", params={"source": "gsm8k", "min_reward": 1, "limit": 1000}
    ).json()["rows"]
    assert only and all(r["data_source"] == "gsm8k" and r["reward"] >= 1 for r in only)
    wrong = httpx.get(
        dashboard_url + "/api/samples", params={"correct": "false", "reason": "no_answer"}
    ).json()["rows"]
    assert wrong and all(not r["correct"] and r["reason"] == "no_answer" for r in wrong)
    text = httpx.get(dashboard_url + "/api/samples", params={"q": "what is 0 +"}).json()["rows"]
    assert {r["prompt_id"] for r in text} == {"p000"}
    assert (
        httpx.get(dashboard_url + "/api/samples", params={"limit": 2}).json()["rows"].__len__() == 2
    )
    assert httpx.get(dashboard_url + "/api/samples", params={"min_reward": "x"}).status_code == 400


@pytest.mark.parametrize("estimator", ["rloo", "drgrpo", "gae"])
def test_sample_advantages_follow_the_configured_estimator(redis_url: str, estimator: str) -> None:
    write_stream(redis_url, "exp1")
    reader = SampleReader(redis_url, "exp1", estimator=estimator)
    try:
        rows = reader.read(SampleFilter(limit=1000))["rows"]
    finally:
        reader.close()
    group = sorted((r for r in rows if r["prompt_id"] == "p011"), key=lambda r: r["index"])
    want = group_advantages([r["reward"] for r in group], estimator)
    if want is None:  # batch-level estimators have no per-group figure
        assert all(r["advantage"] is None for r in group)
    else:
        assert [r["advantage"] for r in group] == pytest.approx(want, rel=1e-9)
        assert want != pytest.approx(group_advantages([r["reward"] for r in group], "grpo"))


def test_poison_entries_are_reported_not_fatal(dashboard_url: str, redis_url: str) -> None:
    import redis

    from dynamo_rl.keys import trajectory_stream

    client = redis.Redis.from_url(redis_url)
    client.xadd(trajectory_stream("exp1"), {b"v": b"1", b"g": b"\xff\xfe not protobuf"})
    client.close()
    data = httpx.get(dashboard_url + "/api/samples").json()
    assert len(data["decode_errors"]) == 1 and data["rows"]


def test_redis_down_gives_503_on_samples_and_charts_still_render(
    tmp_path: Path, free_port: int
) -> None:
    dashboard = Dashboard(
        log=JsonlLog(tmp_path / "none.jsonl"),
        scraper=Scraper([]),
        samples=SampleReader(f"redis://127.0.0.1:{free_port}/0", "exp1"),
        run_name="exp1",
    )
    server = make_server(dashboard, "127.0.0.1", 0)
    serve_in_thread(server)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert httpx.get(url + "/api/samples").status_code == 503
        charts = httpx.get(url + "/api/charts").json()
        assert charts["sources"]["redis"]["ok"] is False
        assert len(charts["charts"]) == len(CHARTS) + 4  # + the DynaMO views (run folder)
    finally:
        server.shutdown()
        server.server_close()


def test_cli_rejects_a_bad_config_with_exit_2(tmp_path: Path) -> None:
    import subprocess

    from tests.conftest import dynamo_rl_argv

    result = subprocess.run(
        dynamo_rl_argv("dashboard", "run.name=bad name"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "run.name" in result.stderr and "Traceback" not in result.stderr


def test_jsonl_points_keep_the_newest(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": i, "loss": i}) + "\n" for i in range(2500)))
    log = JsonlLog(path)
    t0 = time.perf_counter()
    log.refresh()
    pts = log.points("loss")
    assert len(pts) == 2000 and pts[-1] == [2499.0, 2499.0]
    assert time.perf_counter() - t0 < 5


def test_dashboard_imports_no_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import dashboard.cli, dashboard.server, dashboard.sources\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
