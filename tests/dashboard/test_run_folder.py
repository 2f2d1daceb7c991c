"""The dashboard on a run folder: recorded metric histories, the sample log and ``up``'s
evaluations, read while the run goes on and after it ended; the allocation charts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dashboard.server import Dashboard
from dashboard.sources import (
    JsonlLog,
    RunFolder,
    SampleFilter,
    SampleReader,
    Scraper,
    allocation_charts,
)
from dynamo_rl.metrics import ServiceMetrics, read_history
from tests.dashboard.dashboard_data import write_metrics_log, write_stream


def _run_folder(tmp_path: Path, redis_url: str) -> tuple[Path, list]:
    """A run folder as a run leaves it: a learner log, two services' metric histories, a sample
    log of the same groups as the Redis stream, the evaluations and up's summary."""
    from dynamo_rl.metrics import history_path
    from dynamo_rl.sample_log import SampleLog

    run = tmp_path / "run"
    groups = write_stream(redis_url, "exp1")
    write_metrics_log(run / "metrics.jsonl", steps=10)
    log = SampleLog.in_run(run, "w0", 32)
    log.write(groups)
    m = ServiceMetrics("rollout")
    pushed = m.counter("groups_total", "groups")
    depth = m.gauge("pending_groups", "unread")
    path = history_path(run, "rollout", "w0")
    path.parent.mkdir(parents=True)
    with open(path, "w") as f:  # History's lines, 5 s apart (as run.history.interval_s=5 writes)
        for i in range(5):
            pushed.inc(4)
            depth.set(i)
            line = {"t": 1.7e9 + 5 * i, "service": "rollout", "instance": "w0",
                    "interval_s": 5.0, "samples": m.snapshot()}  # fmt: skip
            f.write(json.dumps(line) + "\n")
    for label, acc in (("before", 0.25), ("after", 0.5)):
        (run / f"eval_{label}.json").write_text(json.dumps({
            "accuracy": acc, "n": 4, "prompts": 10,
            "by_data_source": {"arith": {"accuracy": acc / 2, "prompts": 5},
                               "gsm8k": {"accuracy": acc * 1.5, "prompts": 5}},
            # The arith task's difficulty tiers (eval's by_tier).
            "by_tier": {"easy": {"accuracy": acc + 0.25, "prompts": 3},
                        "hard": {"accuracy": acc - 0.25, "prompts": 2}},
        }))  # fmt: skip
    return run, groups


def test_the_stream_and_the_sample_log_give_the_same_rows(redis_url: str, tmp_path: Path) -> None:
    # Both go through one row builder (dashboard.sources.sample_rows): the same groups read from
    # Redis and from the sample log are the same rows, but for the entry id (stream id, batch id).
    run, groups = _run_folder(tmp_path, redis_url)
    flt = SampleFilter(limit=1000)
    reader = SampleReader(redis_url, "exp1")
    try:
        from_redis = reader.read(flt)
    finally:
        reader.close()
    from_folder = RunFolder(run).read(flt)

    def rows(page: dict) -> list[str]:
        return sorted(json.dumps({k: v for k, v in r.items() if k != "entry_id"}, sort_keys=True)
                      for r in page["rows"])  # fmt: skip

    assert len(from_redis["rows"]) == sum(len(g.responses) for g in groups)
    assert rows(from_redis) == rows(from_folder)
    assert (from_redis["sources"], from_redis["reasons"]) == (
        from_folder["sources"],
        from_folder["reasons"],
    )


def test_run_folder_replaces_the_scrape_and_redis_after_the_run(
    redis_url: str, tmp_path: Path
) -> None:
    run, _groups = _run_folder(tmp_path, redis_url)
    live = Dashboard(
        log=JsonlLog(run / "metrics.jsonl"),
        scraper=Scraper([]),
        samples=SampleReader(redis_url, "exp1"),
        run_name="exp1",
        run=RunFolder(run, grpo_n=8),
    )
    running = live.charts_payload()
    assert running["state"] == "running" and running["sources"]["redis"]["ok"] is True
    by_id = {c["id"]: c for c in running["charts"]}
    # The rollout worker's history draws the Prometheus charts with no scrape at all.
    (pending,) = [ln for ln in by_id["queue"]["lines"] if ln["label"].startswith("stream")]
    assert [p[1] for p in pending["points"]] == [0.0, 1.0, 2.0, 3.0, 4.0]
    (pushed,) = [ln for ln in by_id["groups"]["lines"] if ln["label"] == "pushed by rollout"]
    assert len(pushed["points"]) == 4  # rates between the 5 snapshots
    assert running["sources"]["metrics"] == "run folder"
    # The sample log gives the same allocation charts as the stream it mirrors.
    from_redis = {c["id"]: c for c in live.samples.stream_charts()}
    from_folder = {c["id"]: c for c in live.run.stream_charts()}
    for chart_id in ("stream_alloc", "stream_half_solved"):
        assert from_folder[chart_id]["bars"] == from_redis[chart_id]["bars"]
        assert from_folder[chart_id]["lines"] == from_redis[chart_id]["lines"]
    assert running["evaluations"]["after"]["by_data_source"]["gsm8k"]["accuracy"] == 0.75
    # Per tier too, before and after (the page draws each part's row with the change in points).
    tiers = {label: {part: v["accuracy"] for part, v in e["by_data_source"].items()
                     if part.startswith("tier/")}
             for label, e in running["evaluations"].items()}  # fmt: skip
    assert tiers == {"before": {"tier/easy": 0.5, "tier/hard": 0.0},
                     "after": {"tier/easy": 0.75, "tier/hard": 0.25}}  # fmt: skip

    # up ends: summary.json; Redis is gone (a closed port), the run reads as finished.
    (run / "summary.json").write_text(json.dumps({"accuracy_after": 0.5}))
    gone = Dashboard(
        log=JsonlLog(run / "metrics.jsonl"),
        scraper=Scraper([]),
        samples=SampleReader("redis://127.0.0.1:1/0", "exp1"),
        run_name="exp1",
        run=RunFolder(run, grpo_n=8),
    )
    after = gone.charts_payload()
    assert after["state"] == "finished"
    assert after["sources"]["redis"] == {"configured": True, "skipped": "run finished"}
    ids = {c["id"]: c for c in after["charts"]}
    assert ids["stream_alloc"]["bars"] == from_redis["stream_alloc"]["bars"]
    rows = gone.samples_payload(SampleFilter(source="gsm8k", correct=True, limit=1000))
    assert rows["origin"] == "run folder"
    assert rows["rows"] and all(r["data_source"] == "gsm8k" and r["correct"] for r in rows["rows"])
    redis_rows = live.samples.read(SampleFilter(source="gsm8k", correct=True, limit=1000))["rows"]
    assert sorted(r["response"] for r in rows["rows"]) == sorted(r["response"] for r in redis_rows)


def test_zero_advantage_share_against_grpo_expectation(redis_url: str, tmp_path: Path) -> None:
    run, groups = _run_folder(tmp_path, redis_url)
    folder = RunFolder(run, grpo_n=8)
    chosen, charts = folder.dynamo_charts(None)
    zero = {c["id"]: c for c in charts}["zero_advantage"]
    actual, expected = zero["lines"]
    # By hand, per weight version: responses in all-equal groups / all responses, and the mean
    # over groups of p^8 + (1-p)^8 with p the prompt's success rate (one group per prompt here).
    want_actual: dict[int, list[int]] = {}
    want_expected: dict[int, list[float]] = {}
    for g in groups:
        rewards = [r.reward for r in g.responses]
        p = sum(r.correct for r in g.responses) / len(rewards)
        t = want_actual.setdefault(g.weight_version, [0, 0])
        t[0] += len(rewards) if len(set(rewards)) == 1 else 0
        t[1] += len(rewards)
        want_expected.setdefault(g.weight_version, []).append(p**8 + (1 - p) ** 8)
    assert actual["points"] == [[float(v), z / n] for v, (z, n) in sorted(want_actual.items())]
    assert [p[0] for p in expected["points"]] == [float(v) for v in sorted(want_expected)]
    assert [p[1] for p in expected["points"]] == pytest.approx(
        [sum(e) / len(e) for _v, e in sorted(want_expected.items())]
    )
    # The per-prompt views follow the chosen prompt.
    chosen, charts = folder.dynamo_charts("p005")
    by_id = {c["id"]: c for c in charts}
    assert chosen == "p005"
    (alloc,) = by_id["prompt_alloc"]["lines"]
    assert [p[1] for p in alloc["points"]] == [float(groups[5].allocated_n)]
    (prio,) = by_id["prompt_priority"]["lines"]
    assert prio["points"][0][1] == pytest.approx(groups[5].priority)


def test_run_folder_follows_a_growing_and_downsampled_history(tmp_path: Path) -> None:
    from dynamo_rl.metrics import History, history_path

    m = ServiceMetrics("rollout")
    pushed = m.counter("groups_total", "groups")
    history = History(m, history_path(tmp_path, "rollout", "w0"), 5.0, 6000)
    folder = RunFolder(tmp_path)

    def values() -> list[float]:
        folder.refresh()
        ((_name, snaps),) = folder.snapshots()
        return [s.samples[("dynamo_rollout_groups_total", ())] for s in snaps]

    for _ in range(3):
        pushed.inc()
        history.write_once()
    assert values() == [1.0, 2.0, 3.0]
    pushed.inc()
    history.write_once()
    assert values() == [1.0, 2.0, 3.0, 4.0]  # only the appended line was new
    while history.downsamples == 0:
        pushed.inc()
        history.write_once()
    # Rewritten shorter: read again from the start, every other snapshot, first and last kept.
    assert values() == [s[2] for line in read_history(history.path) for s in line["samples"]]
    assert values()[0] == 1.0 and values()[-1] == pushed._value.get()


def test_allocation_charts_count_allocations_and_the_half_solved_share_by_version() -> None:
    """Counts per allocated n over every group; per weight version, the responses of groups with
    accuracy in [0.25, 0.75] (bounds included) over all responses; a group without responses
    counts for its allocation only."""
    groups = [
        (4, 1, [True, False, False, False]),  # 0.25: half-solved (bound)
        (4, 1, [True, True, True, True]),  # mastered
        (2, 1, [True, False]),  # 0.5
        (8, 2, [True] * 6 + [False] * 2),  # 0.75: half-solved (bound)
        (8, 2, [False] * 8),  # hopeless
        (2, 3, []),
    ]
    alloc, half = allocation_charts(iter(groups), "title")
    assert alloc["title"] == "title"
    assert alloc["bars"] == [{"label": "2", "value": 2.0}, {"label": "4", "value": 2.0},
                             {"label": "8", "value": 2.0}]  # fmt: skip
    assert half["lines"][0]["points"] == [[1.0, 6 / 10], [2.0, 8 / 16]]
    assert allocation_charts(iter([]), "t")[1]["lines"] == []


def test_the_services_warnings_are_listed_once_each_oldest_first(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "model" / "sft.run").mkdir(parents=True)
    note = {"service": "rollout0", "kind": "prompts_over_length", "about": "d", "message": "3 of 9"}
    (run / "warnings.jsonl").write_text(
        json.dumps({**note, "t": 3.0}) + "\n" + json.dumps({**note, "service": "rollout1", "t": 4.0})
        + "\n"  # another worker said it again: one warning
    )  # fmt: skip
    (run / "model" / "sft.run" / "warnings.jsonl").write_text(json.dumps(
        {"service": "sft", "kind": "examples_too_long", "about": "d", "message": "m", "t": 1.0}
    ) + "\n")  # fmt: skip
    board = Dashboard(log=JsonlLog(run / "metrics.jsonl"), scraper=Scraper([]), samples=None,
                      run_name="w", run=RunFolder(run))  # fmt: skip
    assert board.charts_payload()["warnings"] == [
        {"service": "sft", "kind": "examples_too_long", "message": "m", "t": 1.0},
        {"service": "rollout0", "kind": "prompts_over_length", "message": "3 of 9", "t": 3.0},
    ]
    # A warning appended later shows on the next request, beside those read before.
    with open(run / "warnings.jsonl", "a") as f:
        f.write(json.dumps({**note, "kind": "engine_left_out", "about": "e", "t": 2.0}) + "\n")
    assert [w["kind"] for w in board.charts_payload()["warnings"]] == [
        "examples_too_long", "engine_left_out", "prompts_over_length"]  # fmt: skip
    assert Dashboard(log=JsonlLog(run / "x"), scraper=Scraper([]), samples=None, run_name="w",
                     run=RunFolder(None)).charts_payload()["warnings"] == []  # fmt: skip
