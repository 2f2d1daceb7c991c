"""Each shipped recipe once, against our committed range: one command to check a machine against
ours.

    .venv/bin/python benchmarks/recipes.py                      # quick settings, seed 0, each recipe
    .venv/bin/python benchmarks/recipes.py --only quickstart,agent_when --seeds 0,1
    .venv/bin/python benchmarks/recipes.py --full               # the configs' own settings
    .venv/bin/python benchmarks/recipes.py --record --seeds 0,1,2
                  # writes benchmarks/results/recipes_quick.json, the quick ranges checked against

For each recipe in ``RECIPES`` it runs ``dynamo-rl up --config configs/<recipe>.yaml run.seed=N``
through the real services (``quickstart_seeds.start``), one run at a time by default (the wall
times are part of the check), into ``<runs>/<recipe>-<quick|full>-seed<N>`` with ``up``'s output
in ``up.log``; a run whose ``summary.json`` exists is read, not run again. Then one line per run:
held-out accuracy before -> after RL, the gain in points, and the gain against the committed range
for that mode — in range, or above or below it by how many points — and the run's wall time.

- Quick (the default): the config with the recipe's quick overrides (fewer warm-start and RL
  steps, a smaller evaluation; ``RECIPES``), a few minutes a recipe. Its range is the per-seed
  gains in ``benchmarks/results/recipes_quick.json``, which ``--record`` writes; without that file
  (or with other quick overrides recorded there) the line says so, and no range is invented.
- ``--full``: the configs as shipped. The range is the per-seed gains of the committed result
  each recipe's figures in README.md and docs/benchmarks.md come from (``RECIPES``: file, and
  where the gains sit in it), read when the script runs.

Not in the list: ``configs/distill.yaml`` (it needs a teacher model folder, ``up.teacher.model``)
and ``configs/verifiers_multi_turn.yaml`` (no committed result to compare with). The exit code is
0 whatever the verdicts (it is a report); 1 when a run failed (``up`` exited non-zero, or a warm
start failed its check). Written to ``--out`` (default ``<runs>/recipes_<quick|full>.json``; with
``--record``, ``benchmarks/results/recipes_<quick|full>.json``) through ``_machine.write_result``:
per recipe its settings, each run's figures and the verdicts. Runs through the services are not
bit-reproducible (batch composition depends on timing), so a machine like ours lands in range
most of the time, not always.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from _machine import write_result  # noqa: E402 - the result file, with its machine
from agent_recipe import failed_warm_start  # noqa: E402 - how up reports a failed warm start
from quickstart_seeds import result_of, start  # noqa: E402 - one way to run and read an up run

RESULTS = REPO / "benchmarks" / "results"

# The quickstarts' quick settings: the warm start to the config's target (greedy exact match 0.55
# on the check), at most 700 steps (the shipped seeds 0-4 took 450-700) and no extension for a
# tier below 0.1, so its time is bounded; an evaluation of 200 held-out prompts x 2 samples instead
# of 1,000 x 4; RL of 24 steps instead of 120 (the pool of 384 prompts is revisited from step 13).
# A warm start of 300 steps was too short: seed 0 stayed at exact match 0.03-0.04 from step 150 to
# 300 (the skill comes as a jump later), held-out accuracy 2.8% before RL.
_QUICKSTART = [
    "up.warm_start.steps=700", "up.warm_start.min_tier_accuracy=0", "up.eval.prompts=200",
    "up.eval.samples=2",
]  # fmt: skip
# The agent recipes' quick settings: the warm start as shipped (the copy of the tool's output is a
# phase change a shorter one misses: docs/benchmarks.md, "When to call"), extended at most once
# instead of twice; 200 held-out questions x 2 samples; 10 RL steps of 16 prompts x 8 episodes
# instead of 30-40 (whether 10 steps give a gain is not measured yet: recipes.py --record).
_AGENT = [
    "up.warm_start.max_extensions=1", "up.eval.prompts=200", "up.eval.samples=2",
    "learner.max_steps=10",
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A shipped config, its quick overrides, and where its committed full-settings gains are:
    ``committed`` (a file under ``benchmarks/results``) and ``gains`` (a dotted path in it, ``*``
    for every item of a list, to the per-seed gains in points)."""

    config: str
    quick: tuple[str, ...]
    committed: str
    gains: str


RECIPES = {
    "quickstart": Recipe(
        "configs/quickstart.yaml", (*_QUICKSTART, "learner.max_steps=24"),
        "quickstart_pool384_dynamo.json", "runs.*.gain_points",
    ),
    # LoRA learns more slowly per step (200 shipped steps to the full fine-tune's 120).
    "quickstart_lora": Recipe(
        "configs/quickstart_lora.yaml", (*_QUICKSTART, "learner.max_steps=30"),
        "quickstart_lora_seeds.json", "runs.*.gain_points",
    ),
    "agent_tools": Recipe(
        "configs/agent_tools.yaml", tuple(_AGENT), "agent_recipe.json", "seeds.*.tools.gain_points"
    ),
    "agent_when": Recipe(
        "configs/agent_when.yaml", tuple(_AGENT), "agent_when.json", "seeds.*.rl.gain_points"
    ),
    "agent_code": Recipe(
        "configs/agent_code.yaml", tuple(_AGENT), "agent_code.json", "record.gain_points"
    ),
}  # fmt: skip
QUICK_RANGES = "recipes_quick.json"
POLL_S = 2.0  # seconds between looks at the running ups
NO_QUICK_RANGE = "no committed quick range yet (run recipes.py --record)"


def values_at(doc, path: str) -> list[float]:
    """The numbers at ``path`` in ``doc`` (dotted keys, ``*`` for each item of a list); an item
    without the key is skipped (a seed whose run did not finish)."""
    found = [doc]
    for key in path.split("."):
        nxt = []
        for node in found:
            if key == "*" and isinstance(node, list):
                nxt.extend(node)
            elif isinstance(node, dict) and key in node:
                nxt.append(node[key])
        found = nxt
    return [float(v) for v in found if isinstance(v, int | float)]


def committed_range(name: str, full: bool, results: Path | None = None) -> dict | str:
    """The committed per-seed gains of ``name`` for the mode, read from the result files in
    ``results`` (default ``RESULTS``): ``{"min", "max", "seeds", "file"}``, or a line saying why
    there is none."""
    recipe, results = RECIPES[name], results or RESULTS
    if full:
        path, gains = results / recipe.committed, recipe.gains
    else:
        path, gains = results / QUICK_RANGES, f"recipes.{name}.runs.*.gain_points"
    if not path.exists():
        return f"no committed range: {path.name} is missing" if full else NO_QUICK_RANGE
    doc = json.loads(path.read_text())
    if not full:
        recorded = doc.get("recipes", {}).get(name)
        if recorded is None:
            return NO_QUICK_RANGE
        if recorded.get("overrides") != list(recipe.quick):
            return (f"{path.name} was recorded with other quick settings "
                    f"(run recipes.py --record again)")  # fmt: skip
    values = values_at(doc, gains)
    if not values:
        return f"no committed range: {path.name} has no {gains}"
    return {"min": min(values), "max": max(values), "seeds": len(values), "file": path.name}


def verdict(gain: float, span: dict | str) -> str:
    """``gain`` (points) against ``span``: in range, or above or below it by how much."""
    if isinstance(span, str):
        return span
    if gain > span["max"]:
        return f"above the range by {gain - span['max']:+.1f}"
    if gain < span["min"]:
        return f"below the range by {gain - span['min']:+.1f}"
    return "in range"


def line(name: str, run: dict, span: dict | str) -> str:
    """One run's report line."""
    where = ""
    if isinstance(span, dict):
        seeds = f"{span['seeds']} seed{'s' if span['seeds'] != 1 else ''}"
        where = f"committed {span['min']:+.1f}..{span['max']:+.1f} ({seeds}, {span['file']}): "
    return (f"{name} seed {run['seed']}: {100 * run['accuracy_before']:.1f}% -> "
            f"{100 * run['accuracy_after']:.1f}% ({run['gain_points']:+.1f} points); "
            f"{where}{verdict(run['gain_points'], span)}; {run['wall_s']:.0f} s")  # fmt: skip


def run_dir_of(runs: Path, name: str, full: bool, seed: int) -> Path:
    return runs / f"{name}-{'full' if full else 'quick'}-seed{seed}"


def run_all(
    todo: list[tuple[str, int]], runs: Path, full: bool, jobs: int, overrides: list[str]
) -> dict[tuple[str, int], str | None]:
    """Run each (recipe, seed) not yet finished, ``jobs`` at a time, with ``overrides`` after the
    mode's; per run None when it finished, else why it failed."""
    waiting = [
        (n, s) for n, s in todo if not (run_dir_of(runs, n, full, s) / "summary.json").exists()
    ]
    running: dict[tuple[str, int], object] = {}
    failed: dict[tuple[str, int], str | None] = dict.fromkeys(todo)
    while waiting or running:
        while waiting and len(running) < jobs:
            name, seed = key = waiting.pop(0)
            run_dir = run_dir_of(runs, name, full, seed)
            print(f"{name} seed {seed}: running {run_dir}", flush=True)
            given = [] if full else list(RECIPES[name].quick)
            running[key] = start(
                run_dir, [*given, *overrides], seed, False, REPO / RECIPES[name].config
            )
        for key, proc in list(running.items()):
            if proc.poll() is None:
                continue
            del running[key]
            run_dir = run_dir_of(runs, key[0], full, key[1])
            if proc.returncode != 0:
                ws = failed_warm_start(run_dir)
                failed[key] = (f"the warm start failed its check: {ws['error']}" if ws
                               else f"up exited {proc.returncode}; see {run_dir / 'up.log'}")  # fmt: skip
        time.sleep(POLL_S)
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--full", action="store_true", help="the configs' own settings (not quick)")
    p.add_argument(
        "--only", help=f"recipes to run, comma-separated (default all: {','.join(RECIPES)})"
    )
    p.add_argument("--seeds", default="0", help="run.seed values (default 0)")
    p.add_argument("--runs", default="runs/recipes", help="folder of the run folders")
    p.add_argument("--out", help="result JSON (see above for the default)")
    p.add_argument("--record", action="store_true",
                   help="write benchmarks/results/recipes_<quick|full>.json: the ranges to check "
                        "against")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="runs at the same time (default 1)")
    p.add_argument("overrides", nargs="*",
                   help="config overrides for every run (key=value), after the quick ones; the "
                        "ranges were not measured with them")  # fmt: skip
    args = p.parse_args(argv)
    names = [n for n in (args.only or ",".join(RECIPES)).split(",") if n]
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        p.error(f"--only: unknown {', '.join(unknown)}; allowed: {', '.join(RECIPES)}")
    if args.record and args.overrides:
        p.error("--record: no overrides (the recorded ranges are for the mode's settings alone)")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    mode = "full" if args.full else "quick"
    runs = Path(args.runs).resolve()
    began = time.monotonic()
    todo = [(n, s) for n in names for s in seeds]
    failed = run_all(todo, runs, args.full, max(1, args.jobs), args.overrides)
    doc: dict = {"mode": mode, "seeds": seeds, "overrides": args.overrides, "cpus": os.cpu_count(),
                 "recipes": {}}  # fmt: skip
    for name in names:
        recipe = RECIPES[name]
        span = committed_range(name, args.full)
        record: dict = {"config": recipe.config, "overrides": [] if args.full else list(recipe.quick),
                        "committed": span, "runs": [], "failed": {}}  # fmt: skip
        for seed in seeds:
            if failed[(name, seed)]:
                record["failed"][str(seed)] = failed[(name, seed)]
                print(f"{name} seed {seed}: failed: {failed[(name, seed)]}", flush=True)
                continue
            run = result_of(run_dir_of(runs, name, args.full, seed), name, seed, [])
            run["verdict"] = verdict(run["gain_points"], span)
            record["runs"].append(run)
            print(line(name, run, span), flush=True)
        gains = [r["gain_points"] for r in record["runs"]]
        if gains:
            record["gain_points"] = {"min": min(gains), "max": max(gains),
                                     "mean": round(sum(gains) / len(gains), 2)}  # fmt: skip
        record["wall_s"] = round(sum(r["wall_s"] for r in record["runs"]), 1)
        doc["recipes"][name] = record
        print(f"{name}: {record['wall_s']:.0f} s of up", flush=True)
    doc["wall_s"] = round(time.monotonic() - began, 1)
    print(f"total: {doc['wall_s']:.0f} s")
    default = RESULTS if args.record else runs
    out = Path(args.out or default / f"recipes_{mode}.json")
    write_result(out, doc, indent=2)
    print(out)
    return 1 if any(failed.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
