"""The built-in dashboard in a real browser: headless Chromium against a live ``dynamo-rl dashboard``.

The run is live in every part the dashboard reads: a real Redis holding codec-encoded trajectory
groups, a learner JSONL metrics log on disk, and every service's real metric class serving
``/metrics`` with values that keep changing. The page marks its body with ``data-ready`` and the
number of charts that drew data; ``--dump-dom`` reads that back after the scripts ran. The
screenshot lands in the test's tmp dir (``DYNAMO_SCREENSHOT_DIR`` copies it elsewhere). The
screenshots in ``docs/img/`` are of a real run, not of this fixture (test_dashboard_run.py).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from dynamo_rl.notices import Notices
from dynamo_rl.procs import http_ok
from tests.conftest import dynamo_rl_argv
from tests.dashboard.dashboard_data import serving_service_metrics, write_metrics_log, write_stream

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (scripts/setup.sh installs it as root)"
)


def chromium(tmp_path: Path, *args: str, timeout: float = 90) -> str:
    profile = tmp_path / f"chromium-profile-{time.monotonic_ns()}"
    argv = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        # Virtual time: let the page's fetches and timers run, then capture.
        "--virtual-time-budget=6000",
        *args,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


NO_SIGNAL = "5 train steps in a row with every reward 0: no learning signal"


def body_attrs(dom: str) -> dict[str, str]:
    match = re.search(r"<body([^>]*)>", dom)
    assert match, dom[:500]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', match.group(1)))


@pytest.fixture
def live_dashboard(redis_url: str, tmp_path: Path, service, free_port: int):
    from dynamo_rl.sample_log import SampleLog

    groups = write_stream(redis_url, "browser-run", groups=16)
    log = tmp_path / "run" / "metrics.jsonl"
    write_metrics_log(log, steps=60)
    # A live run's rollout worker logs what it pushes to the run folder (the DynaMO views).
    SampleLog.in_run(tmp_path / "run", "w0", 32).write(groups)
    # ... and the learner a warning the user must act on (the page lists it).
    Notices(tmp_path / "run", "learner").warn(logging.getLogger("test"), "no_signal", NO_SIGNAL)
    with serving_service_metrics(engines=2) as urls:
        argv = dynamo_rl_argv(
            "dashboard",
            "--port",
            str(free_port),
            "--metrics-log",
            str(log),
            "--interval",
            "0.5",
            *[a for url in urls for a in ("--scrape", url)],
            f"endpoints.redis_url={redis_url}",
            "run.name=browser-run",
            f"run.dir={tmp_path / 'run'}",
        )
        base = f"http://127.0.0.1:{free_port}"
        service("dashboard", argv, http_ok(base + "/healthz"), timeout=60)
        # Rates need two scrapes of every target; wait until each target has some.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            scrape = httpx.get(base + "/api/charts").json()["sources"]["scrape"]
            if all(t["snapshots"] >= 3 for t in scrape):
                break
            time.sleep(0.3)
        yield base, urls


def test_charts_page_renders_every_chart_with_data(live_dashboard, tmp_path: Path) -> None:
    base, _urls = live_dashboard
    api = httpx.get(base + "/api/charts").json()
    assert all(t["ok"] for t in api["sources"]["scrape"]), api["sources"]["scrape"]
    with_data = {
        c["id"] for c in api["charts"] if c["bars"] or any(line["points"] for line in c["lines"])
    }
    # Every service's metric class exists: every chart must have data.
    assert with_data == {c["id"] for c in api["charts"]}, {
        c["id"] for c in api["charts"]
    } - with_data
    # Charts fed by the JSONL log and the stream have data whatever else exists.
    assert {"reward", "loss", "kl", "entropy", "beta", "stream_alloc", "stream_half_solved"} <= (
        with_data
    )
    engines = next(c for c in api["charts"] if c["id"] == "tokens")["lines"]
    assert len(engines) == 2, engines  # one line per engine replica

    dom = chromium(tmp_path, "--dump-dom", base + "/")
    attrs = body_attrs(dom)
    assert attrs.get("data-ready") == "true", attrs
    assert int(attrs["data-charts"]) == len(api["charts"])
    # The browser drew what the API has: same number of charts with data (± a chart whose first
    # rate point arrives between the two reads).
    assert abs(int(attrs["data-charts-with-data"]) - len(with_data)) <= 1, attrs
    assert dom.count("<polyline") >= 10 and dom.count("<rect") >= 5
    assert "no data yet" not in dom
    assert attrs["data-warnings"] == "1" and f"learner: {NO_SIGNAL}" in dom

    shot = tmp_path / "dashboard.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1700", base + "/")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # A blank or error page of this size compresses to a few kB; charts and text do not.
    assert len(data) > 40_000, len(data)
    if os.environ.get("DYNAMO_SCREENSHOT_DIR"):
        out = Path(os.environ["DYNAMO_SCREENSHOT_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, out / "dashboard.png")


def test_samples_page_lists_filtered_samples(live_dashboard, tmp_path: Path) -> None:
    base, _urls = live_dashboard
    dom = chromium(tmp_path, "--dump-dom", base + "/samples?source=gsm8k&correct=true&limit=50")
    attrs = body_attrs(dom)
    assert attrs.get("data-ready") == "true", attrs
    rows = re.findall(r"<tr class=\"(correct|wrong)\">(.*?)</tr>", dom, re.S)
    assert int(attrs["data-rows"]) == len(rows) > 0
    for cls, row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        assert cls == "correct" and cells[1] == "gsm8k", cells
        assert cells[4] == "1"  # reward
        assert cells[2].startswith("What is ")  # prompt text from the codec entry
    # The filter choices come from the stream: both data sources are offered.
    assert '<option value="arith">arith</option>' in dom

    shot = tmp_path / "samples.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,900", base + "/samples")
    assert shot.stat().st_size > 20_000
    if os.environ.get("DYNAMO_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["DYNAMO_SCREENSHOT_DIR"]) / "dashboard-samples.png")
