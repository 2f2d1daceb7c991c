"""``dynamo-rl stage``: up's recipe stages run on their own (docker-compose.yml's one-shots), and
compose's default experiment is the quickstart's."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml

from dynamo_rl.config import load_config
from launcher.stage import expected_paths
from tests.conftest import REPO, dynamo_rl_argv

SMALL = [
    "up.task_train=64",
    "up.task_test=16",
    "up.tiny_model.hidden_size=32",
    "up.tiny_model.num_heads=2",
    "up.tiny_model.num_kv_heads=1",
    "up.warm_start.steps=2",
    "up.warm_start.batch_size=8",
    # Unchecked: 2 steps learn no tier.
    "up.warm_start.check_rows=0",
    "up.warm_start.target_exact=null",
]


def _paths(run_dir: Path) -> list[str]:
    return [
        f"run.dir={run_dir}",
        f"rollout.dataset={run_dir}/data/train.parquet",
        f"engine.model={run_dir}/model/sft",
        f"learner.model={run_dir}/model/sft",
    ]


def _stage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dynamo_rl_argv("stage", *args), capture_output=True, text=True,
                          timeout=600, cwd=REPO, check=False)  # fmt: skip


def test_prepare_makes_the_data_model_and_config_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = _stage("prepare", *_paths(run_dir), *SMALL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (run_dir / "data" / "train.parquet").is_file()
    assert (run_dir / "data" / "test.parquet").is_file()
    assert (run_dir / "model" / "init" / "config.json").is_file()
    sft = run_dir / "model" / "sft"
    assert (sft / "config.json").is_file()
    assert "supervised warm start: 2 steps" in r.stdout
    # The resolved config every later stage reads, without the control token.
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert written["engine"]["model"] == str(sft) and written["up"]["warm_start"]["steps"] == 2
    assert "control_token" not in written["endpoints"]
    # Run again (a restarted stack): nothing is rebuilt.
    before = (sft / "config.json").stat().st_mtime_ns
    r = _stage("prepare", *_paths(run_dir), *SMALL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warm start" not in r.stdout and "building" not in r.stdout
    assert (sft / "config.json").stat().st_mtime_ns == before


def test_paths_elsewhere_are_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    paths = _paths(run_dir)
    paths[2] = f"engine.model={tmp_path}/elsewhere"
    r = _stage("prepare", *paths, *SMALL)
    assert r.returncode == 2
    assert "engine.model" in r.stderr and str(run_dir / "model" / "sft") in r.stderr
    assert not run_dir.exists()


def test_eval_needs_prepare_first(tmp_path: Path) -> None:
    r = _stage("eval-before", *_paths(tmp_path / "run"), "up.eval.prompts=4")
    assert r.returncode == 1 and "dynamo-rl stage prepare" in r.stdout


def test_eval_off_is_a_clean_no_op(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("{}\n")
    note = {"service": "rollout", "kind": "prompt_refused", "about": "", "message": "p refused"}
    (run_dir / "warnings.jsonl").write_text(json.dumps(note) + "\n")
    r = _stage("eval-after", *_paths(run_dir), "up.eval.prompts=0")
    assert r.returncode == 0 and "evaluation off" in r.stdout, r.stdout + r.stderr
    # Nothing evaluated, the run's warnings still shown.
    assert "warning from rollout: p refused (more in the rollout service's log)" in r.stdout
    assert not (run_dir / "summary.json").exists()


def test_compose_experiment_is_the_quickstart_with_compose_paths() -> None:
    compose = load_config(REPO / "deploy" / "compose" / "quickstart.yaml", env={})
    quick = load_config(REPO / "configs" / "quickstart.yaml", env={})
    assert compose.rollout.dataset == expected_paths(compose)["rollout.dataset"]
    assert compose.engine.model == compose.learner.model == expected_paths(compose)["engine.model"]
    a = json.loads(compose.model_dump_json())
    b = json.loads(quick.model_dump_json())
    for tree in (a, b):
        tree["run"].pop("dir")
        tree["rollout"].pop("dataset")
        tree["engine"].pop("model")
        tree["learner"].pop("model")
    assert a == b


def test_eval_before_keeps_the_first_measurement(tmp_path: Path) -> None:
    # `docker compose up -d` again re-runs the one-shots: the trained model must not become the
    # "before" figure. (No engine runs here: an evaluation would fail.)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("{}\n")
    (run_dir / "eval_before.json").write_text(json.dumps({"accuracy": 0.25}))
    r = _stage("eval-before", *_paths(run_dir), "up.eval.prompts=4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "held-out accuracy before RL: 0.250" in r.stdout
    assert json.loads((run_dir / "eval_before.json").read_text()) == {"accuracy": 0.25}


def test_eval_after_waits_for_the_learners_last_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("{}\n")
    steps = run_dir / "metrics.jsonl"
    steps.write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    # The learner's warning, written twice (a restart): shown once, as up shows it.
    note = {"service": "learner", "kind": "no_signal", "about": "", "message": "no learning signal"}
    (run_dir / "warnings.jsonl").write_text(2 * (json.dumps(note) + "\n"))
    out = tmp_path / "stage.out"
    argv = dynamo_rl_argv("stage", "eval-after", *_paths(run_dir), "up.eval.prompts=4",
                          "learner.max_steps=3", "endpoints.engine_urls=[http://127.0.0.1:9]")  # fmt: skip
    with open(out, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while "step 1/3" not in out.read_text():
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        # Step 2 is not the last: still waiting (the learner pushes after every step).
        with open(steps, "a") as f:
            f.write(json.dumps({"step": 2}) + "\n")
        while "step 2/3" not in out.read_text():
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        assert proc.poll() is None, out.read_text()
        assert "held-out accuracy after" not in out.read_text()
        with open(steps, "a") as f:
            f.write(json.dumps({"step": 3}) + "\n")
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    # Then the evaluation (which fails here: no engine answers).
    assert text.index("step 3/3") < text.index("held-out accuracy after RL"), text
    shown = "warning from learner: no learning signal (more in the learner service's log)"
    assert text.count(shown) == 1 and text.index(shown) < text.index("held-out accuracy after RL")
