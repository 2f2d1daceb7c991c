"""The agent recipe over seeds: tool-RL against text-only RL on the built-in ``products`` task.

    .venv/bin/python benchmarks/agent_recipe.py                 # seeds 0,1,2, one run at a time
    .venv/bin/python benchmarks/agent_recipe.py --seeds 3
    .venv/bin/python benchmarks/agent_recipe.py --quick         # smoke run (tiny settings)

For each seed it runs ``dynamo-rl up --config configs/agent_tools.yaml run.seed=N`` (a warm start
on tool-using demonstrations, then RL in ``rollout.env: tools`` episodes with a calculator) and
``dynamo-rl up --config configs/agent_text.yaml run.seed=N`` (a warm start on the direct answers,
then single-turn RL), through the real services; both at the same rollout budget (prompts per
step x samples per prompt x steps, from the configs). Each run goes to ``<runs>/<recipe>-seed<N>``
with ``up``'s output in ``up.log``; a run whose ``summary.json`` exists is read, not run again.

Written to ``--out`` (default ``benchmarks/results/agent_recipe.json``; with ``--quick``
``/tmp/agent_recipe_quick.json``): one record per seed with both recipes' held-out accuracy before
and after RL (the tool recipe's measured in its episodes, with the tool), what the evaluated
episodes did (tool-call rate, tool-error rate, turns per episode), the same per learner step over
training, the rollouts used, wall times and the load average; then the ranges and each seed's
margin (tool-RL after minus text-only RL after, in points). Runs through the services are not
bit-reproducible (batch composition depends on timing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from _machine import write_result  # noqa: E402 - the result file, with its machine
from quickstart_seeds import warm_start_evals  # noqa: E402 - the warm start's log, read once

RECIPES = {
    "tools": REPO / "configs" / "agent_tools.yaml",
    "text": REPO / "configs" / "agent_text.yaml",
}
# Tiny settings for a smoke run: every stage of both recipes runs, in a few minutes.
QUICK = [
    "up.task_train=200",
    "up.task_test=20",
    "up.tiny_model.hidden_size=32",
    "up.tiny_model.num_layers=1",
    "up.warm_start.steps=10",
    "up.warm_start.batch_size=8",
    "up.warm_start.rows=20",
    "up.warm_start.check_rows=0",
    "up.eval.prompts=6",
    "up.eval.samples=2",
    "learner.max_steps=2",
    "rollout.batch_size=4",
    "rollout.n=4",
    "allocator.n_per_prompt=4",
    "learner.train_batch_size=4",
    "rollout.max_pending_groups=8",
]
CURVE_KEYS = (
    "accuracy_mean",
    "reward_mean",
    "tool_call_rate",
    "tool_error_rate",
    "episode_turns_mean",
    "response_len_mean",
)


def run_dir_of(runs: Path, recipe: str, seed: int) -> Path:
    return runs / f"{recipe}-seed{seed}"


def run_up(
    run_dir: Path,
    recipe: str,
    seed: int,
    quick: bool,
    config: Path | None = None,
    overrides: Sequence[str] = (),
) -> list[float]:
    """One ``dynamo-rl up`` run (blocking) of ``config`` (default the recipe's) with
    ``overrides`` last, unless ``run_dir`` holds a finished run (its ``summary.json``) or one
    whose warm start failed its check (:func:`failed_warm_start`; delete the folder to run it
    again); the 1-minute load average sampled while it ran ([] when it did not run). A run
    that fails otherwise raises SystemExit; one whose warm start fails its check does not (the
    caller reads it with :func:`failed_warm_start`)."""
    if (run_dir / "summary.json").exists() or failed_warm_start(run_dir) is not None:
        return []
    print(f"{recipe} seed {seed}: running {run_dir}", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "dynamo_rl.cli",
        "up",
        "--config",
        str(config or RECIPES[recipe]),
        f"run.seed={seed}",
        f"run.dir={run_dir}",
        *(QUICK if quick else []),
        *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    load: list[float] = []
    with open(run_dir / "up.log", "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        while proc.poll() is None:
            load.append(round(os.getloadavg()[0], 1))
            time.sleep(2)
    if proc.returncode != 0 and failed_warm_start(run_dir) is None:
        raise SystemExit(f"{recipe} seed {seed}: up exited {proc.returncode}; see {run_dir}/up.log")
    (run_dir / "load.json").write_text(json.dumps(load))
    return load


def episodes_of(eval_result: dict) -> dict | None:
    """What the evaluated episodes did (``dynamo-rl eval``'s ``episodes``), or None (one turn)."""
    for bench in eval_result.get("benchmarks", {}).values():
        if "episodes" in bench:
            return bench["episodes"]
    return None


def curve(run_dir: Path) -> list[dict]:
    """Per learner step: the step's training figures (tool statistics for episodes)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if "step" not in r or "responses" not in r:
            continue
        out.append(
            {
                "step": r["step"],
                "responses": r["responses"],
                **{k: round(r[k], 4) for k in CURVE_KEYS if k in r},
            }
        )
    return out


def mean_over(points: list[dict], key: str, first: bool) -> float | None:
    """Mean of ``key`` over the first (or last) quarter of the steps."""
    values = [p[key] for p in points if key in p]
    if not values:
        return None
    k = max(1, len(values) // 4)
    part = values[:k] if first else values[-k:]
    return round(sum(part) / len(part), 4)


def warm_start_of(run_dir: Path) -> dict:
    """The warm start's steps and each check of it (greedy exact match), from its run log."""
    found = warm_start_evals(run_dir)
    if found is None:
        return {}
    steps, evals = found
    checks = [{"step": r["step"], "greedy_exact": round(r["eval_exact"], 3)} for r in evals]
    return {"steps": steps, "checks": checks}


WARM_START_FAILED = "error: up.warm_start:"
"""How ``up`` reports a warm start that stayed below its check after every extension."""


def failed_warm_start(run_dir: Path) -> dict | None:
    """A run that ``up`` stopped because its warm start failed its check: ``up``'s error line
    with the warm start's checks (None for a run that did not end that way)."""
    log = run_dir / "up.log"
    if (run_dir / "summary.json").exists() or not log.exists():
        return None
    for line in log.read_text().splitlines():
        if WARM_START_FAILED in line:
            return {"error": line.split(WARM_START_FAILED, 1)[1].strip(), **warm_start_of(run_dir)}
    return None


def result_of(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    before = json.loads((run_dir / "eval_before.json").read_text())
    after = json.loads((run_dir / "eval_after.json").read_text())
    load_path = run_dir / "load.json"
    load = json.loads(load_path.read_text()) if load_path.exists() else []
    points = curve(run_dir)
    out = {
        # Relative to the repository when inside it: the JSON is committed.
        "run_dir": str(run_dir.relative_to(REPO) if run_dir.is_relative_to(REPO) else run_dir),
        "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"],
        "gain_points": round(100 * (summary["accuracy_after"] - summary["accuracy_before"]), 2),
        "eval_episodes_before": episodes_of(before),
        "eval_episodes_after": episodes_of(after),
        "warm_start": warm_start_of(run_dir),
        "rollouts": sum(p["responses"] for p in points),
        "steps": len(points),
        "training": {
            f"{key}_{part}": mean_over(points, key, part == "first_quarter")
            for key in CURVE_KEYS
            for part in ("first_quarter", "last_quarter")
            if mean_over(points, key, True) is not None
        },
        "curve": points,
        "wall_s": summary["wall_s"],
    }
    if load:
        out["load_average_1m"] = {"min": min(load), "max": max(load)}
    return out


def settings_of(quick: bool) -> dict:
    """Each recipe's settings as run (the config with the quick overrides)."""
    from dynamo_rl.config import load_config

    out = {}
    for recipe, path in RECIPES.items():
        cfg = load_config(str(path), QUICK if quick else [])
        rc, lc, up = cfg.rollout, cfg.learner, cfg.up
        out[recipe] = {
            "config": str(path.relative_to(REPO)),
            "task": {"name": up.task, "train": up.task_train, "test": up.task_test},
            "model": up.tiny_model.model_dump(),
            "warm_start": up.warm_start.model_dump(
                exclude={
                    "tiers",
                    "check_rows",
                    "min_tier_accuracy",
                    "extend_steps",
                    "max_extensions",
                }
            ),
            "eval": up.eval.model_dump(),
            "rollout_budget": {
                "prompts_per_step": rc.batch_size,
                "n": cfg.allocator.n_per_prompt,
                "steps": lc.max_steps,
                "rollouts": rc.batch_size * cfg.allocator.n_per_prompt * (lc.max_steps or 0),
            },
            "allocation": rc.allocation,
            "sampling": dataclasses.asdict(rc.sampling),
            "env": rc.env.model_dump(
                include={
                    "name",
                    "system_prompt",
                    "max_turns",
                    "max_tool_calls",
                    "max_episode_tokens",
                }
            ),
            "learner": {
                "lr": lc.lr,
                "advantage": lc.algorithm.advantage.type,
                "policy_loss": lc.algorithm.policy_loss.type,
                "modulation": lc.algorithm.modulation.enabled,
            },
        }
    return out


def out_path(given: str | None, quick: bool, name: str) -> Path:
    """``--out``, else ``/tmp/<name>_quick.json`` (``--quick``) or
    ``benchmarks/results/<name>.json``."""
    default = (
        f"/tmp/{name}_quick.json" if quick else REPO / "benchmarks" / "results" / f"{name}.json"
    )
    return Path(given or default)


def write_doc(out: Path, doc: dict) -> None:
    """The result JSON with its machine record (``write_result``); its path printed."""
    write_result(out, doc, indent=2, default=str)
    print(out)


def span(values: list[float]) -> dict:
    return {"min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 4)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="run.seed values (default 0,1,2)")
    p.add_argument("--runs", default="runs/agent-recipe", help="folder of the run folders")
    p.add_argument("--out", help="result JSON (see above for the default)")
    p.add_argument("--quick", action="store_true", help="tiny smoke settings")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    out = out_path(args.out, args.quick, "agent_recipe")
    runs = Path(args.runs).resolve()
    records = []
    for seed in seeds:
        record: dict = {"seed": seed}
        for recipe in RECIPES:
            run_dir = run_dir_of(runs, recipe, seed)
            run_up(run_dir, recipe, seed, args.quick)
            record[recipe] = result_of(run_dir)
        record["margin_points"] = round(
            100 * (record["tools"]["accuracy_after"] - record["text"]["accuracy_after"]), 2
        )
        records.append(record)
        t, x = record["tools"], record["text"]
        ep = t["eval_episodes_after"] or {}
        print(
            f"seed {seed}: tool-RL {100 * t['accuracy_before']:.1f}% -> "
            f"{100 * t['accuracy_after']:.1f}% (tool-call rate {ep.get('tool_call_rate', 0):.2f}, "
            f"tool errors {ep.get('tool_error_rate', 0):.3f}, turns {ep.get('turns_mean', 0):.2f}); "
            f"text-only RL {100 * x['accuracy_before']:.1f}% -> {100 * x['accuracy_after']:.1f}%; "
            f"margin {record['margin_points']:+.1f} points",
            flush=True,
        )
    margins = [r["margin_points"] for r in records]
    doc = {
        "command": "dynamo-rl up --config configs/agent_tools.yaml run.seed=N; "
        "dynamo-rl up --config configs/agent_text.yaml run.seed=N",
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "note": "through the real services; not bit-reproducible (batch composition depends on "
        "timing); accuracy is avg@samples at the eval temperature on held-out prompts; "
        "the tool recipe is evaluated in its episodes (with the calculator); wall times "
        "on a machine shared with other jobs (load_average_1m)",
        "settings": settings_of(args.quick),
        "ranges": {
            "margin_points": span(margins),
            **{
                f"{recipe}_{which}": span([r[recipe][f"accuracy_{which}"] for r in records])
                for recipe in RECIPES
                for which in ("before", "after")
            },
        },
        "seeds": records,
    }
    print(
        f"margin (tool-RL - text-only RL, after): {min(margins):+.1f} .. {max(margins):+.1f} "
        f"points over {len(margins)} seeds"
    )
    write_doc(out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
