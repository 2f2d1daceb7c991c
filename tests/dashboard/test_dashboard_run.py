"""The dashboard after a real run: a short ``dynamo-rl up`` (small settings), every service gone,
then ``dynamo-rl dashboard --config <run>/config.yaml`` in headless Chromium.

Every chart must have data from the run folder alone (the services' metric histories, the learner
log, the sample log), the held-out evaluations shown, the samples listed, and the run read as
finished rather than "Redis down". With the trackers installed (the dev extras), the same run logs
to TensorBoard and wandb (offline), read back here. ``DYNAMO_SCREENSHOT_DIR`` copies the
screenshots elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from dynamo_rl.procs import http_ok
from tests.conftest import REPO, dynamo_rl_argv
from tests.dashboard.test_dashboard_browser import CHROMIUM, body_attrs, chromium
from tests.dynamo_rl.test_trackers import tensorboard_scalars, wandb_run

STEPS = 4
TRACKERS = [k for k in ("tensorboard", "wandb") if importlib.util.find_spec(k) is not None]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/setup.sh)"),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("up") / "run"
    argv = dynamo_rl_argv(
        "up", "--config", str(REPO / "configs" / "quickstart.yaml"), "--steps", str(STEPS),
        f"run.dir={run_dir}", "run.name=dashrun", "up.warm_start.steps=0", "up.eval.prompts=12",
        "up.eval.samples=2", "up.task_train=16", "up.task_test=40", "up.tiny_model.hidden_size=32",
        "up.tiny_model.num_layers=1", "rollout.batch_size=8", "learner.train_batch_size=8",
        # Snapshots every second: even a run this short leaves several per service.
        "run.history.interval_s=1",
        # 16 prompts, 8 per batch: each comes back, so the allocator has priorities to show.
        # The grad method: the learner reports gradient statistics (their chart) and the
        # allocator reads them, end to end through the services.
        "allocator.method=grad",
        *([f"learner.trackers=[{','.join(TRACKERS)}]"] if TRACKERS else []),
    )  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run_dir


def test_a_finished_run_folder_is_a_complete_record(finished_run: Path) -> None:
    services = {p.name.split("-", 1)[0] for p in (finished_run / "metrics").glob("*.jsonl")}
    assert services == {"allocator", "reward", "engine", "rollout", "learner"}
    groups = [json.loads(x) for x in (finished_run / "samples" / "worker0.jsonl").open()]
    assert len(groups) >= 8 * STEPS and all(g["responses"] for g in groups)
    if "tensorboard" in TRACKERS:
        scalars, config = tensorboard_scalars(finished_run)
        assert set(scalars["loss"]) == set(range(1, STEPS + 1))
        assert STEPS in scalars["eval/after/accuracy"] and "dashrun" in config
    if "wandb" in TRACKERS:
        config, history = wandb_run(finished_run)
        assert config["run"]["name"] == "dashrun"
        assert all("loss" in history[s] for s in range(1, STEPS + 1))
        after = json.loads((finished_run / "eval_after.json").read_text())
        assert history[STEPS]["eval/after/accuracy"] == pytest.approx(after["accuracy"])


def test_dashboard_after_the_run_shows_everything(
    finished_run: Path, service, free_port: int, tmp_path: Path
) -> None:
    base = f"http://127.0.0.1:{free_port}"
    argv = dynamo_rl_argv("dashboard", "--config", str(finished_run / "config.yaml"),
                          "--port", str(free_port))  # fmt: skip
    service("dashboard", argv, http_ok(base + "/healthz"), timeout=60)
    api = httpx.get(base + "/api/charts", timeout=120).json()
    assert api["state"] == "finished"
    assert api["sources"]["metrics"] == "run folder"
    empty = [c["id"] for c in api["charts"]
             if not c["bars"] and not any(line["points"] for line in c["lines"])]  # fmt: skip
    assert empty == []
    assert set(api["evaluations"]) == {"before", "after"}

    dom = chromium(tmp_path, "--dump-dom", base + "/")
    attrs = body_attrs(dom)
    assert attrs.get("data-ready") == "true" and attrs.get("data-state") == "finished", attrs
    assert int(attrs["data-charts-with-data"]) == int(attrs["data-charts"]) == len(api["charts"])
    assert "no data yet" not in dom and "DOWN" not in dom
    # The evaluation table: all prompts, the data source and each tier, before and after.
    from dynamo_rl.trackers import eval_breakdown

    after = json.loads((finished_run / "eval_after.json").read_text())
    tiers = [part for part in eval_breakdown(after) if part.startswith("tier/")]
    assert tiers and all(t in api["evaluations"]["before"]["by_data_source"] for t in tiers)
    assert int(attrs["data-evaluations"]) == 2 + len(tiers) and "all held-out prompts" in dom
    assert all(f"<td>{t}</td>" in dom for t in tiers)
    assert "run finished" in dom

    samples = chromium(tmp_path, "--dump-dom", base + "/samples?limit=50")
    rows = re.findall(r"<tr class=\"(correct|wrong)\">", samples)
    assert int(body_attrs(samples)["data-rows"]) == len(rows) > 0
    assert "sample log" in samples

    shots = {"dashboard-run.png": ("/", "1400,2200"), "dashboard-run-samples.png":
             ("/samples?limit=40", "1400,900")}  # fmt: skip
    for name, (path, size) in shots.items():
        shot = tmp_path / name
        chromium(tmp_path, f"--screenshot={shot}", f"--window-size={size}", base + path)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        if os.environ.get("DYNAMO_SCREENSHOT_DIR"):
            out = Path(os.environ["DYNAMO_SCREENSHOT_DIR"])
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, out / name)
