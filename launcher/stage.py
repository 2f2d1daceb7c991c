"""``dynamo-rl stage``: one stage of ``dynamo-rl up``'s recipe on its own, for deployments that
start each service separately (docker-compose.yml's one-shot services).

- ``prepare``: ``up``'s first two stages with the same config keys (``up.task*``,
  ``up.tiny_model``, ``up.warm_start``, ``run.seed``) into ``run.dir``: the built-in task in
  ``data/`` and a tiny Qwen2 model warm-started with ``dynamo-rl sft`` in ``model/sft``; then the
  resolved config as ``config.yaml``, as ``up`` writes it. The experiment must point the services at
  those paths (``rollout.dataset: <run.dir>/data/train.parquet``, ``engine.model`` and
  ``learner.model``: ``<run.dir>/model/sft``); ``prepare`` refuses one whose paths are elsewhere, so
  a typo cannot start the services on something it did not make. Steps whose output exists are
  skipped: a restarted stack keeps its model.
- ``eval-before`` / ``eval-after``: ``up``'s held-out evaluation (``up.eval``: avg@k on the task's
  test split through the engines and the reward service) into ``<run.dir>/eval_<label>.json``;
  ``eval-after`` also prints both figures and writes ``summary.json`` as ``up`` does.
  ``eval-before`` is skipped when its file exists: a restarted stack (``docker compose up -d``
  again, which re-runs the one-shots) would otherwise measure the trained model as "before".
  ``eval-after`` first waits for the learner to log step ``learner.max_steps`` in
  ``<run.dir>/metrics.jsonl`` (its last push is done by then), printing each step and each of the
  services' warnings (``<run.dir>/warnings.jsonl``, :mod:`dynamo_rl.notices`) as ``up`` does:
  a service still running while training goes on, not a one-shot started after it, so that
  ``docker compose up --wait`` returns once the stack is up (it fails on a container that has
  exited unless another service waits for that one's completion).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from dynamo_rl.cli import parse_config, service_parser
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.run_layout import init_model, warm_start_model
from launcher.console import StepProgress
from launcher.up import Launcher

__all__ = ["STAGES", "expected_paths", "main"]

STAGES = ("prepare", "eval-before", "eval-after")
POLL_S = 2.0
"""How often ``eval-after`` reads the learner's step log while it waits."""


def expected_paths(cfg: ExperimentConfig) -> dict[str, str]:
    """Config key -> the path ``prepare`` writes it to (what the experiment must name)."""
    run_dir = Path(cfg.run.run_dir).resolve()
    model = str(warm_start_model(run_dir) if cfg.up.warm_start.steps else init_model(run_dir))
    return {
        "rollout.dataset": str(run_dir / "data" / "train.parquet"),
        "engine.model": model,
        "learner.model": model,
    }


def _check_paths(cfg: ExperimentConfig) -> bool:
    want = expected_paths(cfg)
    have = {
        "rollout.dataset": cfg.rollout.dataset,
        "engine.model": cfg.engine.model,
        "learner.model": cfg.learner.model,
    }
    ok = True
    for key, value in have.items():
        if value != want[key]:
            ok = False
            print(f"dynamo-rl stage: {key} is {value!r}; it must be {want[key]!r} (what prepare "
                  f"writes for run.dir {cfg.run.run_dir!r})", file=sys.stderr)  # fmt: skip
    return ok


def _dump(cfg: ExperimentConfig) -> dict:
    return cfg.model_dump(mode="json", exclude={"endpoints": {"control_token"}})


def prepare(cfg: ExperimentConfig) -> int:
    # up's own stages, on the config without the paths (so that they build rather than reuse).
    tree = _dump(cfg)
    tree["rollout"]["dataset"] = None
    tree["engine"]["model"] = None
    tree["learner"]["model"] = None
    launcher = Launcher(ExperimentConfig.model_validate(tree))
    launcher.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        launcher.say(f"preparing {launcher.run_dir}")
        dataset, _test = launcher.prepare_data()
        model = launcher.prepare_model(dataset)
    except RuntimeError as e:
        launcher.say(f"error: {e}")
        return 1
    finally:
        launcher.sup.stop_all()
    want = expected_paths(cfg)
    if (dataset, model) != (want["rollout.dataset"], want["engine.model"]):
        launcher.say(f"error: prepared {dataset}, {model}; the config expects {want}")
        return 1
    (launcher.run_dir / "config.yaml").write_text(yaml.safe_dump(_dump(cfg), sort_keys=False))
    launcher.say(f"task data {dataset}, model {model}: ready")
    return 0


def wait_for_learner(launcher: Launcher) -> None:
    """Until the learner's step log reaches ``learner.max_steps`` (no deadline: as long as
    training takes; the learner's container is restarted after a crash and resumes)."""
    max_steps = launcher.cfg.learner.max_steps
    steps = StepProgress(launcher.run_dir / "metrics.jsonl", max_steps, launcher.say)
    if max_steps is None:
        launcher.say("learner.max_steps is null: evaluating the weights the engines hold now")
        return
    launcher.say(f"waiting for the learner to reach step {max_steps}")
    while True:
        steps.poll()
        launcher.board.poll()
        if steps.last >= max_steps:
            return
        time.sleep(POLL_S)


def evaluate(cfg: ExperimentConfig, label: str) -> int:
    launcher = Launcher(cfg)
    if not (launcher.run_dir / "config.yaml").exists():
        launcher.say(f"error: no {launcher.run_dir / 'config.yaml'}: run `dynamo-rl stage prepare`")
        return 1
    done = launcher.run_dir / f"eval_{label}.json"
    if label == "before" and done.exists():
        accuracy = json.loads(done.read_text())["accuracy"]
        launcher.say(f"held-out accuracy before RL: {accuracy:.3f} (measured when the stack "
                     f"first started: {done}; delete it to measure again)")  # fmt: skip
        return 0
    if label == "after" and cfg.up.eval.prompts:
        wait_for_learner(launcher)
    test_data = str(Path(expected_paths(cfg)["rollout.dataset"]).with_name("test.parquet"))
    try:
        result = launcher.evaluate(test_data, label)
        if label == "after" and result is not None:
            before_file = launcher.run_dir / "eval_before.json"
            before = json.loads(before_file.read_text()) if before_file.exists() else None
            launcher.summary(before, result)
    except RuntimeError as e:
        launcher.say(f"error: {e}")
        return 1
    finally:
        launcher.sup.stop_all()
    if label == "after":
        launcher.board.poll()  # the run's warnings, also when nothing was evaluated
    if result is None:
        launcher.say("held-out evaluation off (up.eval.prompts=0)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # service_parser's flags and epilog, with the stage as the first positional (before overrides).
    base = service_parser("stage", __doc__.splitlines()[0].split(": ", 1)[1])
    parser = argparse.ArgumentParser(prog=base.prog, description=base.description,
                                     epilog=base.epilog)  # fmt: skip
    parser.add_argument("stage", choices=STAGES, help="the stage to run")
    parser.add_argument("--config", metavar="FILE", help="experiment YAML (a section per service)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    args, cfg = parse_config(parser, argv)
    if not _check_paths(cfg):
        return 2
    if args.stage == "prepare":
        return prepare(cfg)
    return evaluate(cfg, args.stage.removeprefix("eval-"))
