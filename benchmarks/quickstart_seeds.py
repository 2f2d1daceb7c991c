"""The quickstart over seeds: ``dynamo-rl up --config configs/quickstart.yaml run.seed=N`` for each
seed, through the real services, and its held-out accuracy before and after RL.

    .venv/bin/python benchmarks/quickstart_seeds.py                  # seeds 0-4, 2 at a time
    .venv/bin/python benchmarks/quickstart_seeds.py --seeds 1,3 --jobs 1
    .venv/bin/python benchmarks/quickstart_seeds.py --method grpo     # the same, allocation
                                                                     # uniform and modulation off
    .venv/bin/python benchmarks/quickstart_seeds.py --method dynamo-prompt-mean
                                                 # DynaMO with learner.algorithm.agg=prompt-mean
    .venv/bin/python benchmarks/quickstart_seeds.py --method dynamo-grad
                                                 # allocator.method=grad (dynamo-uniform: n = 8)
    .venv/bin/python benchmarks/quickstart_seeds.py --method ds-rounds-skip --compare ds.json
                  # informative batches (every step 32 groups with a signal): rounds of 2 and the
                  # skip rule against dynamic sampling at uniform n (--method ds wrote ds.json)
    .venv/bin/python benchmarks/quickstart_seeds.py --quick          # smoke run (tiny settings)
    .venv/bin/python benchmarks/quickstart_seeds.py --config configs/quickstart_lora.yaml \
        --seeds 0,1,2 --runs runs/quickstart-lora-seeds --out benchmarks/results/quickstart_lora_seeds.json
                                                 # the LoRA policy's quickstart

Each run goes to ``<runs>/<method>-seed<N>`` with ``up``'s output in ``up.log`` there; a run whose
``summary.json`` exists is read, not run again (so an interrupted sweep continues). Written to
``--out`` (default ``benchmarks/results/quickstart_seeds.json``; with ``--quick``,
``/tmp/quickstart_seeds_quick.json``), with a plot beside it (same name, ``.png``; ``--compare
FILE ...`` draws earlier result files next to it): per seed the accuracies and the gain in points,
the warm start's steps and its per-tier check (greedy accuracy on held-out train rows), the wall
time of the whole run and of its stages (from ``up``'s timestamps), the load average while it
ran, and what the learner's steps generated and allocated (``metrics.jsonl``); then the range of
the gains, and with ``--compare`` this sweep against each earlier one, paired by seed, with 95% t
intervals (``paired_to_compare``: a list when several files are given): the differences in
accuracy and gain, the ratios of generated tokens per step and of the RL stage's wall time.

    .venv/bin/python benchmarks/quickstart_seeds.py --method grpo --out /tmp/grpo.json
    .venv/bin/python benchmarks/quickstart_seeds.py --method dynamo-uniform --out /tmp/uni.json \
        --compare /tmp/grpo.json                  # what modulation adds (allocation: uniform)
    .venv/bin/python benchmarks/quickstart_seeds.py --compare /tmp/uni.json /tmp/grpo.json
                                                 # what allocation adds, and both together

 Runs through the services are not bit-reproducible: which rollouts
form a batch depends on timing (workers, engine and learner run concurrently), so one seed run
twice gives close but not identical figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import write_result  # noqa: E402 - the result file, with its machine
from sample_efficiency import paired, t_interval  # noqa: E402 - seed-paired t intervals, shared

CONFIG = REPO / "configs" / "quickstart.yaml"
METHODS = {
    "dynamo": [],
    # GRPO as the quickstart runs it: uniform n = 8 per prompt, no modulation; all else equal.
    "grpo": ["rollout.allocation=uniform", "learner.algorithm.modulation.enabled=false"],
    # DynaMO with each prompt's group weighted equally (the DynaMO recipes' aggregation).
    "dynamo-prompt-mean": ["learner.algorithm.agg=prompt-mean"],
    # The quickstart with uniform n = 8 (modulation and prompt-mean kept): allocation's control.
    "dynamo-uniform": ["rollout.allocation=uniform"],
    # The quickstart with allocation method grad: n ∝ the gradient spread the learner reports.
    "dynamo-grad": ["allocator.method=grad"],
    # The informative batch (docs/allocator.md, "When allocation pays"): every learner step trains
    # on train_batch_size groups whose rewards differ, the worker dropping the all-equal ones.
    # ds: DAPO's dynamic sampling, uniform n = 8 (modulation kept, as in every arm here).
    "ds": ["rollout.allocation=uniform", "rollout.drop_uniform_groups=true"],
    # ds's best arm in benchmarks/informative_batch.py: rounds of 2 that stop a prompt once its
    # group has a signal, and the skip rule (half-life 64) whose skipped budget is not re-spent.
    "ds-rounds-skip": [
        "rollout.drop_uniform_groups=true",
        "rollout.round_size=2",
        "allocator.method=uniform",
        "allocator.skip_after=1",
        "allocator.skip_budget=save",
        "allocator.grad_half_life=64",
    ],
}
# Tiny settings for a smoke run: every stage runs, in a minute or two on an idle machine.
QUICK = [
    "up.task_train=300", "up.task_test=40", "up.tiny_model.hidden_size=32",
    "up.tiny_model.num_layers=1", "up.warm_start.steps=20", "up.warm_start.batch_size=16",
    "up.warm_start.check_rows=8", "up.warm_start.min_tier_accuracy=0", "up.eval.prompts=16",
    "up.eval.samples=2", "learner.max_steps=2", "rollout.batch_size=8", "rollout.n=4",
    "rollout.n_min=2", "rollout.n_max=8", "allocator.n_per_prompt=4", "allocator.n_min=2",
    "allocator.n_max=8", "learner.train_batch_size=8", "rollout.max_pending_groups=8",
]  # fmt: skip
STAMP = re.compile(r"^\[\s*([0-9.]+)s\] (.*)$")
# up's log lines that open each stage (the first match wins).
STAGES = (
    ("warm_start", "supervised warm start"),
    ("services", "embedded Redis"),  # the services until each answers its health check
    ("eval_before", "held-out accuracy before RL ("),
    ("rl", "held-out accuracy before RL: "),
    ("eval_after", "held-out accuracy after RL ("),
    ("end", "held-out accuracy: "),
)


def stage_times(log: str) -> dict[str, float]:
    """Seconds spent in each stage, from ``up``'s timestamped lines (``[  36.6s] ...``)."""
    starts: dict[str, float] = {}
    for line in log.splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        t, text = float(m.group(1)), m.group(2)
        for name, prefix in STAGES:
            if name not in starts and text.startswith(prefix):
                starts[name] = t
    names = [n for n, _ in STAGES if n in starts]
    return {a: round(starts[b] - starts[a], 1) for a, b in itertools.pairwise(names)}


def warm_start_evals(run_dir: Path) -> tuple[int, list[dict]] | None:
    """The warm start's steps and its checks (the eval records after step 0, the first of each
    step: a resumed run evaluates again at the step it resumes from), from its run log; None when
    there is no log (also used by ``agent_recipe``)."""
    log = run_dir / "model" / "sft.run" / "metrics.jsonl"
    if not log.exists():
        return None
    records = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    steps = max((r["step"] for r in records if r.get("kind") != "eval"), default=0)
    evals: dict[int, dict] = {}
    for r in records:
        if r.get("kind") == "eval" and r["step"] > 0:
            evals.setdefault(r["step"], r)
    return steps, list(evals.values())


def warm_start_check(run_dir: Path) -> dict:
    """The warm start's steps and each check of it (per-tier greedy accuracy), from its run log."""
    found = warm_start_evals(run_dir)
    if found is None:
        return {}
    steps, evals = found
    checks = []
    for r in evals:
        tiers = {k.split("/", 1)[1]: round(v, 3) for k, v in r.items()
                 if k.startswith("eval_exact/")}  # fmt: skip
        checks.append({"step": r["step"], "exact": round(r["eval_exact"], 3),
                       "greedy_accuracy": tiers})  # fmt: skip
    return {"steps": steps, "checks": checks}


def run_dir_of(runs: Path, method: str, seed: int) -> Path:
    return runs / f"{method}-seed{seed}"


def start(
    run_dir: Path, overrides: list[str], seed: int, quick: bool, config: Path = CONFIG
) -> subprocess.Popen:
    """``dynamo-rl up`` of ``config`` with ``overrides`` into ``run_dir`` (its output in
    ``up.log`` there), in the background."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "dynamo_rl.cli", "up", "--config", str(config),
            f"run.seed={seed}", f"run.dir={run_dir}", *overrides,
            *(QUICK if quick else [])]  # fmt: skip
    log = open(run_dir / "up.log", "w")  # noqa: SIM115 - closed with the process
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)


def learner_steps(run_dir: Path) -> dict:
    """What the RL steps spent and allocated, from the learner's step records (the run folder's
    ``metrics.jsonl``): mean generated tokens, rollouts and groups per learner step (kept and
    dropped groups), the allocation counts summed over the steps, and the first step whose
    allocation differed from uniform n. Empty without the records."""
    log = run_dir / "metrics.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    records = [r for r in map(json.loads, filter(str.strip, lines)) if "gen_tokens_kept" in r]
    if not records:
        return {}
    n = len(records)
    out: dict = {"steps": n}
    for what in ("tokens", "rollouts", "groups"):
        total = sum(r[f"gen_{what}_kept"] + r[f"gen_{what}_dropped"] for r in records)
        out[f"gen_{what}_per_step"] = round(total / n, 1)
    dropped = sum(r["gen_groups_dropped"] for r in records)
    out["groups_dropped_share"] = round(dropped / max(1, sum(r["gen_groups_kept"] for r in records)
                                                          + dropped), 4)  # fmt: skip
    if "alloc_above" in records[0]:
        for key in ("alloc_above", "alloc_at", "alloc_below", "alloc_skipped"):
            out[key] = sum(r[key] for r in records)
        off = [r["step"] for r in records
               if r["alloc_above"] or r["alloc_below"] or r["alloc_skipped"]]  # fmt: skip
        out["first_step_off_uniform"] = min(off) if off else None
    return out


def result_of(run_dir: Path, method: str, seed: int, load: list[float]) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    log = (run_dir / "up.log").read_text() if (run_dir / "up.log").exists() else ""
    out = {
        "method": method,
        "seed": seed,
        "run_dir": str(run_dir),
        "accuracy_before": before,
        "accuracy_after": after,
        "gain_points": round(100 * (after - before), 2),
        "wall_s": summary["wall_s"],
        "stages_s": stage_times(log),
        "warm_start": warm_start_check(run_dir),
        "restarts": summary.get("restarts", {}),
        "learner": learner_steps(run_dir),
    }
    if load:
        out["load_average_1m"] = {"min": min(load), "max": max(load)}
    return out


def sweep(
    seeds: list[int], method: str, runs: Path, jobs: int, quick: bool, config: Path = CONFIG
) -> list[dict]:
    todo = [s for s in seeds if not (run_dir_of(runs, method, s) / "summary.json").exists()]
    running: dict[int, subprocess.Popen] = {}
    load: dict[int, list[float]] = {s: [] for s in seeds}
    while todo or running:
        while todo and len(running) < jobs:
            seed = todo.pop(0)
            print(f"seed {seed}: starting {run_dir_of(runs, method, seed)}", flush=True)
            running[seed] = start(
                run_dir_of(runs, method, seed), METHODS[method], seed, quick, config
            )
        for seed, proc in list(running.items()):
            load[seed].append(round(os.getloadavg()[0], 1))
            if proc.poll() is not None:
                del running[seed]
                if proc.returncode != 0:
                    log = run_dir_of(runs, method, seed) / "up.log"
                    raise SystemExit(f"seed {seed}: up exited {proc.returncode}; see {log}")
                print(f"seed {seed}: done", flush=True)
        time.sleep(2)
    return [result_of(run_dir_of(runs, method, s), method, s, load[s]) for s in seeds]


def plot(sets: list[tuple[str, dict]], path: Path) -> None:
    """Held-out accuracy before and after RL per seed, for each (label, result document)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / len(sets)
    for j, (name, d) in enumerate(sets):
        for r in d["runs"]:
            x = r["seed"] + (j - (len(sets) - 1) / 2) * width
            before, after = 100 * r["accuracy_before"], 100 * r["accuracy_after"]
            color = f"C{j}"
            ax.bar(x, after - before, width * 0.9, bottom=before, color=color, alpha=0.8,
                   label=f"{name}: RL's gain" if r is d["runs"][0] else None)  # fmt: skip
            ax.plot([x - width * 0.45, x + width * 0.45], [before] * 2, color="k", lw=1)
            ax.annotate(f"{after - before:+.1f}", (x, after), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(sorted({r["seed"] for _, d in sets for r in d["runs"]}))
    ax.set_xlabel("run.seed (black line: before RL, top of the bar: after)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title("The quickstart through dynamo-rl up, per seed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare(doc: dict, other: dict, name: str) -> dict:
    """This sweep minus ``other`` (an earlier result file), paired by seed: the final held-out
    accuracy and the gain, in points, each with its 95% t interval; printed and returned."""
    out = {"against": name, "method": other.get("method")}
    # Ratios, seed by seed: generation per learner step and the RL stage's wall time.
    ratios = {
        "gen_tokens_per_step": lambda r: r.get("learner", {}).get("gen_tokens_per_step"),
        "rl_wall_s": lambda r: r.get("stages_s", {}).get("rl"),
    }
    for key, get in ratios.items():
        mine, theirs = ({r["seed"]: get(r) for r in d["runs"]} for d in (doc, other))
        ratio = {s: mine[s] / theirs[s] for s in mine if mine[s] and theirs.get(s)}
        p = {**t_interval(list(ratio.values())), "seeds": sorted(ratio)}
        if p["seeds"]:
            out[f"{key}_ratio"] = {"mean": p["mean"], "ci95": p["ci"], "seeds": p["seeds"],
                                   "per_seed": {s: round(v, 3) for s, v in ratio.items()}}  # fmt: skip
            lo, hi = p["ci"]
            print(f"{key} over {name}'s, seeds {p['seeds']}: {p['mean']:.3f}, "
                  f"95% [{lo:.3f}, {hi:.3f}]")  # fmt: skip
    for key in ("accuracy_after", "gain_points"):
        scale = 100 if key == "accuracy_after" else 1
        mine, theirs = ({r["seed"]: scale * r[key] for r in d["runs"]} for d in (doc, other))
        p = paired(mine, theirs)
        out[key] = {"mean": p["mean"], "ci95": p["ci"], "seeds": p["seeds"],
                    "per_seed": {s: round(mine[s] - theirs[s], 2) for s in p["seeds"]}}  # fmt: skip
        if p["seeds"]:
            lo, hi = p["ci"]
            print(f"{key} minus {name} ({other.get('method')}), seeds {p['seeds']}: "
                  f"{p['mean']:+.2f} points, 95% [{lo:+.2f}, {hi:+.2f}]")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3,4", help="run.seed values (default 0,1,2,3,4)")
    p.add_argument("--method", choices=sorted(METHODS), default="dynamo")
    p.add_argument("--config", default=str(CONFIG.relative_to(REPO)),
                   help="the experiment up runs (default configs/quickstart.yaml)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=2, help="runs at the same time (default 2)")
    p.add_argument("--runs", default="runs/quickstart-seeds", help="folder of the run folders")
    p.add_argument("--out", help="result JSON (see above for the default)")
    p.add_argument("--quick", action="store_true", help="tiny smoke settings")
    p.add_argument("--compare", metavar="JSON", nargs="+", default=[],
                   help="earlier result files, paired with this sweep by seed and drawn beside "
                        "it in the plot")  # fmt: skip
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    default_out = "/tmp/quickstart_seeds_quick.json" if args.quick else (
        REPO / "benchmarks" / "results" / "quickstart_seeds.json")  # fmt: skip
    out = Path(args.out or default_out)
    runs = Path(args.runs).resolve()
    config = (REPO / args.config).resolve()
    results = sweep(seeds, args.method, runs, max(1, args.jobs), args.quick, config)
    gains = [r["gain_points"] for r in results]
    for r in results:
        checks = r["warm_start"].get("checks", [])
        shown = checks[-1]["greedy_accuracy"] if checks else {}
        print(f"seed {r['seed']}: {100 * r['accuracy_before']:.1f}% -> "
              f"{100 * r['accuracy_after']:.1f}% ({r['gain_points']:+.2f} points), "
              f"{r['wall_s']:.0f} s, warm start {r['warm_start'].get('steps')} steps {shown}")  # fmt: skip
    print(f"gain: {min(gains):+.2f} .. {max(gains):+.2f} points over {len(gains)} seeds "
          f"(mean {sum(gains) / len(gains):+.2f})")  # fmt: skip
    doc = {
        "command": f"dynamo-rl up --config {args.config} run.seed=N "
                   f"{' '.join(METHODS[args.method])}".strip(),
        "method": args.method,
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "note": "through the real services; not bit-reproducible (batch composition depends on "
                "timing); wall times on a machine shared with other jobs (load_average_1m)",
        "gain_points": {"min": min(gains), "max": max(gains),
                        "mean": round(sum(gains) / len(gains), 2)},
        "runs": results,
    }  # fmt: skip
    others = [(name, json.loads(Path(name).read_text())) for name in args.compare]
    if others:
        pairs = [compare(doc, other, name) for name, other in others]
        doc["paired_to_compare"] = pairs[0] if len(pairs) == 1 else pairs
    sets = [(out.stem, doc)]
    sets += [(Path(name).stem, other) for name, other in others]
    write_with_plot(out, doc, lambda png: plot(sets, png))
    return 0


def write_with_plot(out: Path, doc: dict, draw: Callable[[Path], None]) -> None:
    """``doc`` to ``out`` (with the machine record), then ``draw`` its plot beside it (``.png``);
    without matplotlib (the main job's environment) the plot is skipped, saying why."""
    write_result(out, doc, indent=2)
    print(out)
    try:
        draw(out.with_suffix(".png"))
    except ModuleNotFoundError as e:
        print(f"no plot: {e.name} is not installed (bash scripts/setup.sh --dev installs it)")
    else:
        print(out.with_suffix(".png"))


if __name__ == "__main__":
    raise SystemExit(main())
