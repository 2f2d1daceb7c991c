"""The when-to-call recipe over seeds, against its controls, through ``dynamo-rl up``.

    .venv/bin/python benchmarks/agent_when.py                  # seeds 0..4, one run at a time
    .venv/bin/python benchmarks/agent_when.py --seeds 0 --arms rl
    .venv/bin/python benchmarks/agent_when.py --quick          # smoke run (tiny settings)
    .venv/bin/python benchmarks/agent_when.py --done-only      # summarise the finished runs only

Three arms per seed, each one ``dynamo-rl up --config configs/agent_when.yaml run.seed=N`` (the
same task, model, warm start and evaluation: ``up.eval``, 500 held-out questions x 4 samples in
the config):

- ``rl``: the recipe, RL in ``tools`` episodes with ``rollout.env.tool_call_cost``;
- ``sft``: the SFT-continuation control (``up.sft_control=true``): supervised training on the warm
  start's own demonstrations for RL's compute — ``learner.max_steps`` optimizer steps of
  ``learner.train_batch_size`` x ``rollout.n`` rows (RL's steps, and its sequences per step: one
  episode of RL against one demonstration row) — instead of RL;
- ``mask``: the mask ablation (``learner.algorithm.train_observations=true``): RL that also
  trains the observation tokens.

Each run goes to ``<runs>/<arm>-seed<N>`` (``up``'s output in ``up.log``); a run whose
``summary.json`` exists is read, not run again. The arms of one seed share its warm start's seed,
so their "before" evaluations measure the same warm start (each arm evaluates its own copy).

Written to ``--out`` (default ``benchmarks/results/agent_when.json``; with ``--quick``
``/tmp/agent_when_quick.json``): one record per seed — per arm the held-out accuracy before and
after and, per tier, accuracy and tool-call rate before and after — then, paired by seed with
95% Student-t intervals (``sample_efficiency.paired``): each arm's accuracy gain over its warm
start, RL's gain minus the SFT control's and minus the ablation's, and each arm's call-rate change
on easy and on hard questions. Runs through the services are not bit-reproducible.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from agent_recipe import failed_warm_start, out_path, result_of, run_up, write_doc  # noqa: E402 - one way to run and read an up run
from sample_efficiency import paired  # noqa: E402 - the paired-by-seed interval

CONFIG = REPO / "configs" / "agent_when.yaml"
ARMS: dict[str, list[str]] = {
    "rl": [],
    "sft": ["up.sft_control=true"],
    "mask": ["learner.algorithm.train_observations=true"],
}
TIERS = ("easy", "hard")


def tiers_of(eval_result: dict) -> dict[str, dict]:
    """Per tier: accuracy and tool-call rate of one evaluation (its first benchmark)."""
    [bench] = list(eval_result["benchmarks"].values())[:1]
    out = {}
    for tier, figures in bench.get("by_tier", {}).items():
        episodes = figures.get("episodes", {})
        out[tier] = {
            "accuracy": figures["accuracy"],
            "prompts": figures["prompts"],
            "tool_call_rate": episodes.get("tool_call_rate"),
            "tool_calls_mean": episodes.get("tool_calls_mean"),
        }
    return out


def start_split(run_dir: Path, last_version: int = 2) -> dict[str, dict]:
    """Per tier, how often the episodes of RL's first steps (rollouts sampled at weight versions
    up to ``last_version``, from the run's sample log) were correct when they called the tool and
    when they answered directly: what the call cost is weighed against. Empty for an arm
    without rollouts (the SFT control)."""
    import pyarrow.parquet as pq

    tier_of = {
        f"{row['data_source']}-{row['extra_info']['index']}": row["extra_info"]["tier"]
        for row in pq.read_table(run_dir / "data" / "train.parquet").to_pylist()
    }
    counts: dict[tuple[str, str], list[int]] = {}
    for log in sorted((run_dir / "samples").glob("*.jsonl")):
        for line in log.read_text().splitlines():
            group = json.loads(line)
            if group["weight_version"] > last_version:
                continue
            tier = tier_of[group["prompt_id"]]
            for r in group["responses"]:
                # As the evaluation counts calls: a malformed one has its record too.
                called = any(t["tool_calls"] for t in r["turns"])
                c = counts.setdefault((tier, "call" if called else "direct"), [0, 0])
                c[0] += bool(r["correct"])
                c[1] += 1
    out: dict[str, dict] = {}
    for (tier, how), (right, n) in sorted(counts.items()):
        out.setdefault(tier, {})[how] = {"episodes": n, "accuracy": round(right / n, 4)}
    return out


def arm_record(run_dir: Path) -> dict:
    """One arm of one seed: ``agent_recipe.result_of``'s figures, the per-tier ones, and (with
    rollouts) :func:`start_split`."""
    out = result_of(run_dir)
    out.pop("curve", None)
    if (run_dir / "samples").is_dir():
        out["start_split"] = start_split(run_dir)
    for which in ("before", "after"):
        out[f"tiers_{which}"] = tiers_of(json.loads((run_dir / f"eval_{which}.json").read_text()))
    out["call_rate_change"] = {
        t: round(
            out["tiers_after"][t]["tool_call_rate"] - out["tiers_before"][t]["tool_call_rate"], 4
        )
        for t in TIERS
        if out["tiers_before"].get(t, {}).get("tool_call_rate") is not None
        and out["tiers_after"].get(t, {}).get("tool_call_rate") is not None
    }
    return out


def summarise(records: list[dict], arms: list[str]) -> dict:
    """Paired-by-seed 95% intervals (points for accuracy, rate change for calls)."""

    def by_seed(arm: str, get) -> dict[int, float | None]:
        return {r["seed"]: get(r[arm]) for r in records if arm in r}

    zero = {r["seed"]: 0.0 for r in records}
    out: dict = {}
    for arm in arms:
        out[f"{arm}_gain_points"] = paired(by_seed(arm, lambda a: a["gain_points"]), zero)
        for t in TIERS:
            change = by_seed(arm, lambda a, t=t: a["call_rate_change"].get(t))
            out[f"{arm}_call_rate_change_{t}"] = paired(change, zero)
    for other in ("sft", "mask"):
        if "rl" in arms and other in arms:
            out[f"rl_minus_{other}_gain_points"] = paired(
                by_seed("rl", lambda a: a["gain_points"]),
                by_seed(other, lambda a: a["gain_points"]),
            )
    return out


def seed_record(
    seed: int, arms: list[str], runs: Path, quick: bool, overrides: list[str], done_only: bool
) -> dict:
    """One seed: each arm run (unless done; with ``done_only`` an arm not done is left out of
    the record) and read, a line printed per arm."""
    record: dict = {"seed": seed}
    for arm in arms:
        run_dir = runs / f"{arm}-seed{seed}"
        if "warm_start_failed" in record and not (run_dir / "summary.json").exists():
            print(f"seed {seed} {arm}: not run (the seed's warm start failed its check)")
            continue
        if not done_only:
            run_up(run_dir, arm, seed, quick, CONFIG, [*overrides, *ARMS[arm]])
        if not (run_dir / "summary.json").exists():
            failed = failed_warm_start(run_dir)
            # The arms of a seed share its warm start: it failed for each of them.
            if failed is not None:
                record["warm_start_failed"] = failed
            print(f"seed {seed} {arm}: not run to the end ({run_dir}: "
                  f"{failed['error'] if failed else 'no summary.json'})", flush=True)  # fmt: skip
            continue
        record[arm] = a = arm_record(run_dir)
        rates = ", ".join(
            f"{t} calls {a['tiers_before'][t]['tool_call_rate']:.2f}->"
            f"{a['tiers_after'][t]['tool_call_rate']:.2f}"
            for t in TIERS
            if t in a["call_rate_change"]
        )
        split = "; ".join(
            f"{t} at RL's start: " + ", ".join(f"{how} {100 * f['accuracy']:.0f}% of {f['episodes']}"
                                               for how, f in hows.items())
            for t, hows in a.get("start_split", {}).items()
        )  # fmt: skip
        print(f"seed {seed} {arm}: accuracy {100 * a['accuracy_before']:.1f}% -> "
              f"{100 * a['accuracy_after']:.1f}% ({a['gain_points']:+.1f} points); {rates}"
              + (f"; {split}" if split else ""), flush=True)  # fmt: skip
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3,4", help="run.seed values (default 0,1,2,3,4)")
    p.add_argument("--arms", default="rl,sft,mask", help="arms to run (default rl,sft,mask)")
    p.add_argument("--runs", default="runs/agent-when", help="folder of the run folders")
    p.add_argument("--out", help="result JSON (see above for the default)")
    p.add_argument("--quick", action="store_true", help="tiny smoke settings")
    p.add_argument("--done-only", action="store_true",
                   help="run nothing: read the finished runs, leave the others out")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="config overrides for every arm (key=value)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        p.error(f"--arms: unknown {', '.join(unknown)}; allowed: {', '.join(ARMS)}")
    runs = Path(args.runs).resolve()
    records = [
        seed_record(seed, arms, runs, args.quick, args.overrides, args.done_only) for seed in seeds
    ]
    summary = summarise(records, arms)
    doc = {
        "command": "dynamo-rl up --config configs/agent_when.yaml run.seed=N "
        + " | ".join(f"{arm}: {' '.join(o) or '(the recipe)'}" for arm, o in ARMS.items()),
        "quick": args.quick,
        "overrides": args.overrides,
        "cpus": os.cpu_count(),
        "same_compute": "the sft control: learner.max_steps optimizer steps of "
        "learner.train_batch_size x rollout.n rows, RL's steps and sequences per step",
        "note": "through the real services; not bit-reproducible; accuracy is avg@samples at the "
        "eval temperature on held-out questions, never charged the tool-call cost; intervals "
        "are 95% Student-t over seeds, paired by seed",
        "summary": summary,
        "seeds": records,
    }
    for key, value in summary.items():
        lo, hi = value["ci"]
        print(f"{key}: mean {value['mean']} [{lo:.3f}, {hi:.3f}] over {value['n']} seed(s)")
    write_doc(out_path(args.out, args.quick, "agent_when"), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
