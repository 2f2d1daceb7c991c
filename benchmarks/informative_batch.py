"""Generation needed to fill a learner batch with groups that carry a signal, in-process.

Every arm trains the same number of learner steps on batches of the same size: ``groups`` (B)
groups whose rewards are not all equal, as the rollout side's informative-batch filler
(``rollout.drop_uniform_groups``) hands them to the learner. What differs is how much generation
it takes to find them. The rollout side draws ``draw`` prompts at a time from a shuffled pool
(the worker's batch), asks the allocator how many responses each gets, generates and scores
them, and drops the groups whose rewards were all equal; it draws again until B groups with a
signal are there. Kept groups beyond B wait for the next step, as they would on the stream.

Arms (each is one allocator setting; ``ds`` is the baseline every other is paired with):

- ``ds``         uniform n, drop the all-equal groups: DAPO's dynamic sampling on the rollout
                 side (``allocator.method: uniform``);
- ``skip``       ``ds`` with the skip rule (``allocator.skip_after``, ``skip_budget: save``): a
                 prompt whose last visits gave zero advantage is skipped with a probability that
                 grows with that streak, re-checked now and then; its budget is not re-spent;
- ``skip-hl64``  ``skip`` with ``allocator.grad_half_life`` 64 instead of 4: the skip rule's
                 verdict fades by half every 64 weight versions, not 4 (in a pool a prompt comes
                 back many versions later, when a verdict with half-life 4 has faded to nothing);
- ``dra-skip-hl64``   allocation method ``dra`` (success statistics) with ``skip-hl64``'s rule;
- ``grad-skip-hl64``  allocation method ``grad`` (each prompt's gradient spread, measured in the
                 learner step's own backward, weighed by the same half-life) with that rule;
- ``rounds``     uniform n sampled in rounds of ``round_size`` (``rollout.round_size``,
                 Reinforce-Ada): a prompt stops as soon as its group has a signal;
- ``rounds-skip-hl64``  both: ``skip-hl64``'s rule decides which prompts are sampled, rounds
                 how many responses each gets.

What runs is the product's code: the allocator's function (``allocator.algorithm.
allocate_rollouts`` with ``AllocationParams``, the skip rule's draws included), the learner's step
(``learner.step.RLStep``: old pass, advantages, loss, AdamW, its gradient statistics) with the
step's generation figures (``RLBatch.generation``, the ``gen_*`` fields of the step record), and
the statistics' semantics of the allocator and the worker: success counts added on every report,
a dropped group written as a zero-advantage visit (``gradstats.dropped_records``), a trained
group's statistic from the learner's step. Generation is ``model.generate`` on the policy and
scoring the reward service's math check in-process (``sample_efficiency.py``'s helpers); the
task, model and warm start are ``sample_efficiency.py``'s (``arith``: a warm start on the easy and
medium tiers, an RL pool that also holds the ``hard`` tier, so a visible share of prompts is
all-right or all-wrong).

The summary gives per arm, paired with ``ds`` seed by seed with 95% Student-t intervals: the ratio
of generated tokens (and rollouts) to reach the target accuracy (start + ``target_frac`` × ds's
mean gain), and the accuracy difference at equal learner steps (the last evaluation, on the whole
held-out set). Each (arm, seed) run is one child process writing one file into the cache folder,
so an interrupted benchmark resumes.

    .venv/bin/python benchmarks/informative_batch.py --quick           # smoke run, minutes
    .venv/bin/python benchmarks/informative_batch.py --seeds 0-9 --jobs 2   # the committed result
    .venv/bin/python benchmarks/informative_batch.py --seeds 0-9 --jobs 2 --steps 120 \
        --eval-every 20 --eval-subset 1000 --arms ds,grad-skip-hl64,rounds-skip-hl64 \
        --out benchmarks/results/informative_batch_120           # the longer one
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import sample_efficiency as se  # noqa: E402
from _machine import write_result  # noqa: E402


@dataclass(frozen=True)
class Arm:
    """One arm: the allocator's method, the skip rule on or off, and rounds."""

    method: str = "uniform"
    skip: bool = False
    round_size: int = 0
    half_life: float | None = None
    """``allocator.grad_half_life`` (weight versions after which a statistic, and the skip
    rule's verdict, counts half); None: the settings' (the allocator's default, 4)."""


ARMS = {
    "ds": Arm(),
    "skip": Arm(skip=True),
    "skip-hl64": Arm(skip=True, half_life=64.0),
    "dra-skip-hl64": Arm(method="dra", skip=True, half_life=64.0),
    "grad-skip-hl64": Arm(method="grad", skip=True, half_life=64.0),
    "rounds": Arm(round_size=2),
    "rounds-skip-hl64": Arm(skip=True, half_life=64.0, round_size=2),
}
BASELINE = "ds"


@dataclass
class Settings(se.Settings):
    """``sample_efficiency.Settings`` (task, model, warm start, learner) with this benchmark's
    RL loop."""

    train_prompts: int = 512
    """RL pool; a run visits each prompt a few times, not enough to overfit it."""
    steps: int = 60
    batch_size: int = 16
    """B: groups with a signal in every learner step."""
    draw: int = 16
    """Prompts the rollout side draws at a time (a worker's batch)."""
    n: int = 8
    n_min: int = 2
    n_max: int = 16
    skip_after: int = 1
    skip_max: float = 0.75
    grad_half_life: float = 4.0
    round_size: int = 2
    max_draws: int = 200
    """Draws one learner step may take before the run stops with an error (a pool left with no
    prompt that can give a signal would otherwise draw forever)."""
    eval_every: int = 10
    eval_subset: int = 400
    alloc_agg: str = "prompt-mean"
    stats_decay: float = 1.0
    """The success statistics' decay per report (the allocator's ``decay``)."""


def allocation_params(arm: Arm, s: Settings):
    from dynamo_rl.contracts.allocator import AllocationParams

    return AllocationParams(
        method=arm.method,
        n_per_prompt=s.n,
        n_min=s.n_min,
        n_max=s.n_max,
        grad_half_life=s.grad_half_life if arm.half_life is None else arm.half_life,
        skip_after=s.skip_after if arm.skip else 0,
        skip_max=s.skip_max,
        skip_budget="save",
    )


def learner_algo(s: Settings):
    """Every arm's loss: PPO-clip under prompt-mean (the pairing dynamic allocation needs), no
    modulation (this benchmark measures generation, not the update)."""
    return se.method_algo(se.MethodSpec(allocate=True, modulate=False, agg=s.alloc_agg), s)


def signal(rewards: list[float]) -> bool:
    """The filler's rule: a group has a signal unless every reward is the same."""
    return len(set(rewards)) > 1


def run_one(arm_name: str, seed: int, s: Settings, warm: Path, out_file: Path) -> None:
    import numpy as np
    import torch

    from allocator.algorithm import GradStats, allocate_rollouts
    from dynamo_rl.contracts import gradstats
    from dynamo_rl.contracts.generation import Spent, StepGeneration
    from learner.step import RLBatch

    torch.set_num_threads(1)
    arm = ARMS[arm_name]
    params = allocation_params(arm, s)
    pool, _, test = se.task_rows(s)
    eval_rows = test[: s.eval_subset]
    model, tok = se.load(warm)
    lc = se.learner_config(s, learner_algo(s), groups=s.batch_size)
    step_fn = se.learner_step(model, tok, lc, grad_stats=True)
    order_rng = np.random.default_rng(seed)  # prompt order: the seed's, the same in every arm
    skip_rng = np.random.default_rng(10_007 * seed + 1)  # the allocator's draws
    n_pool = len(pool)
    samples = np.zeros(n_pool)
    successes = np.zeros(n_pool)
    spread = np.full(n_pool, np.nan)
    measured_at = np.zeros(n_pool)
    streak = np.zeros(n_pool)
    order: list[int] = []
    waiting: list[tuple[int, list]] = []  # kept groups not trained yet: (prompt, samples)
    spent = {"tokens": 0, "rollouts": 0, "groups": 0, "draws": 0, "skipped": 0}
    curve: list[dict] = []
    log: list[dict] = []
    t_start = time.time()

    def evaluate(step: int, rows: list[dict], eval_seed: int) -> dict:
        acc = se.evaluate(model, tok, rows, s, eval_seed)
        point = {"step": step, **{k: spent[k] for k in ("tokens", "rollouts")}, **acc}
        print(
            f"[{arm_name} s{seed}] step {step} tokens {spent['tokens']} rollouts "
            f"{spent['rollouts']} greedy {acc['greedy']:.3f} sampled {acc['sampled']:.3f} "
            f"({time.time() - t_start:.0f}s)",
            flush=True,
        )
        return point

    def sample(prompts: list[int], counts: list[int], step: int, r: int) -> list[list]:
        """Generate ``counts[j]`` responses of pool prompt ``prompts[j]``: per prompt, its
        samples (the learner's ``Sample``s, group index j)."""
        group_of = [j for j, c in enumerate(counts) for _ in range(c)]
        out: list[list] = [[] for _ in prompts]
        if not group_of:
            return out
        torch.manual_seed(seed * 1_000_003 + step * 1009 + spent["draws"] * 31 + r)
        model.eval()
        batch, _ = se.sampled_batch(
            model, tok, s, [pool[i] for i in prompts], group_of, [str(i) for i in prompts]
        )
        for smp in batch.samples:
            out[smp.group].append(smp)
        return out

    curve.append(evaluate(0, eval_rows, seed))
    for step in range(1, s.steps + 1):
        dropped = Spent()
        draws_before = spent["draws"]
        while len(waiting) < s.batch_size:
            if spent["draws"] - draws_before >= s.max_draws:
                raise RuntimeError(
                    f"step {step}: {s.max_draws} draws (max_draws) found only {len(waiting)} of "
                    f"{s.batch_size} groups with a signal"
                )
            if len(order) < s.draw:
                order += order_rng.permutation(n_pool).tolist()
            drawn, order = order[: s.draw], order[s.draw :]
            spent["draws"] += 1
            grad = GradStats(spread[drawn], step - 1 - measured_at[drawn], streak[drawn])
            counts = allocate_rollouts(
                samples[drawn], successes[drawn], s.draw * s.n, params, grad=grad,
                skip_draws=skip_rng.random(len(drawn)),
            ).counts.tolist()  # fmt: skip
            spent["skipped"] += sum(1 for c in counts if c == 0)
            if arm.round_size > 0:
                groups: list[list] = [[] for _ in drawn]
                active = [j for j, c in enumerate(counts) if c > 0]
                r = 0
                while active:
                    asks = [min(arm.round_size, counts[j] - len(groups[j])) for j in active]
                    got = sample([drawn[j] for j in active], asks, step, r)
                    for j, g in zip(active, got, strict=True):
                        groups[j] += g
                    active = [
                        j for j in active
                        if len(groups[j]) < counts[j] and not signal([x.reward for x in groups[j]])
                    ]  # fmt: skip
                    r += 1
            else:
                groups = sample(drawn, counts, step, 0)
            for i, g in zip(drawn, groups, strict=True):
                if not g:
                    continue  # skipped: no visit, nothing generated
                rewards = [x.reward for x in g]
                cost = Spent(1, len(g), sum(len(x.response) for x in g))
                spent["tokens"] += cost.tokens
                spent["rollouts"] += cost.rollouts
                spent["groups"] += 1
                # The allocator's report (every group), and what the filler does with it.
                samples[i] = samples[i] * s.stats_decay + len(g)
                successes[i] = successes[i] * s.stats_decay + sum(x.correct for x in g)
                if signal(rewards):
                    waiting.append((i, g))
                else:
                    dropped = dropped + cost
                    # gradstats.dropped_records: a zero-advantage visit, zero gradient.
                    (rec,) = gradstats.dropped_records([str(i)])
                    spread[i], measured_at[i] = rec.spread, step - 1
                    streak[i] += 1
        batch_groups, waiting = waiting[: s.batch_size], waiting[s.batch_size :]
        rows = []
        for gi, (_, g) in enumerate(batch_groups):
            for x in g:
                x.group = gi
                rows.append(x)
        kept = Spent(len(batch_groups), len(rows), sum(len(x.response) for x in rows))
        batch = RLBatch(
            samples=rows,
            prompt_ids=[str(i) for i, _ in batch_groups],
            generation=StepGeneration(kept=kept, dropped=dropped),
        )
        model.train()
        result = step_fn(batch)
        for rec in result.grad_records:  # what the learner writes after its step
            i = int(rec.prompt_id)
            spread[i], measured_at[i] = rec.spread, step
            streak[i] = streak[i] + 1 if rec.zero_advantage else 0
        log.append(
            {
                "step": step,
                **{k: spent[k] for k in ("tokens", "rollouts", "groups", "draws", "skipped")},
                **{k: v for k, v in result.record.items() if k.startswith("gen_")},
                "rows": len(rows),
                "group_means": [float(np.mean([x.reward for x in g])) for _, g in batch_groups],
                "reward": float(np.mean([x.reward for x in rows])),
                "grad_norm": result.record.get("grad_norm"),
            }
        )
        if step % s.eval_every == 0 or step == s.steps:
            curve.append(evaluate(step, eval_rows, seed))
    final = se.evaluate(model, tok, test, s, seed + 1000)
    out_file.write_text(
        json.dumps(
            {
                "arm": arm_name,
                "seed": seed,
                "curve": curve,
                "final": final,
                "spent": spent,
                "waiting": {
                    "groups": len(waiting),
                    "rollouts": sum(len(g) for _, g in waiting),
                    "tokens": sum(len(x.response) for _, g in waiting for x in g),
                },
                "log": log,
                "wall_s": time.time() - t_start,
            }
        )
    )


# ---------------------------------------------------------------------------------------------
# Summary


def to_reach(points: list[dict], key: str, metric: str, target: float) -> float | None:
    return se.rollouts_to_reach([p[key] for p in points], [p[metric] for p in points], target)


def summarise(runs: list[dict], arms: list[str], metric: str, target_frac: float) -> dict:
    import numpy as np

    by = {a: {r["seed"]: r for r in runs if r["arm"] == a} for a in arms}
    base = by[BASELINE]
    start = float(np.mean([r["curve"][0][metric] for r in runs]))
    base_gain = float(np.mean([r["curve"][-1][metric] for r in base.values()])) - start
    target = start + target_frac * base_gain if base_gain > 0 else None
    out: dict[str, Any] = {"metric": metric, "start": start, "target": target, "arms": {}}

    def reach_of(run: dict, key: str) -> float | None:
        return None if target is None else to_reach(run["curve"], key, metric, target)

    for a in arms:
        per_seed: dict[str, dict[int, float | None]] = {}
        for key in ("tokens", "rollouts"):
            reach = {k: reach_of(r, key) for k, r in by[a].items()}
            base_reach = {k: reach_of(r, key) for k, r in base.items()}
            per_seed[f"{key}_to_target"] = reach
            per_seed[f"{key}_ratio"] = {
                k: v / base_reach[k] for k, v in reach.items() if v and base_reach.get(k)
            }
        final = {k: r["final"][metric] for k, r in by[a].items()}
        base_final = {k: r["final"][metric] for k, r in base.items()}
        tokens_per_step = {k: r["spent"]["tokens"] / len(r["log"]) for k, r in by[a].items()}
        base_tps = {k: r["spent"]["tokens"] / len(r["log"]) for k, r in base.items()}
        out["arms"][a] = {
            "seeds": sorted(by[a]),
            "reached": sum(v is not None for v in per_seed["tokens_to_target"].values()),
            "final": se.t_interval(list(final.values())),
            "final_diff": se.paired(final, base_final),
            "tokens_per_step": se.t_interval(list(tokens_per_step.values())),
            "tokens_per_step_ratio": se.t_interval(
                [tokens_per_step[k] / base_tps[k] for k in tokens_per_step if k in base_tps]
            ),
            "tokens_ratio": se.t_interval(list(per_seed["tokens_ratio"].values())),
            "rollouts_ratio": se.t_interval(list(per_seed["rollouts_ratio"].values())),
            "per_seed": {
                "final": final,
                **{k: v for k, v in per_seed.items()},
                "tokens_per_step": tokens_per_step,
            },
        }
    return out


def plot(runs: list[dict], arms: list[str], path: Path, metric: str, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for a in arms:
        rs = [r for r in runs if r["arm"] == a]
        x = np.mean([[p["tokens"] for p in r["curve"]] for r in rs], axis=0)
        y = np.mean([[p[metric] for p in r["curve"]] for r in rs], axis=0)
        steps = [p["step"] for p in rs[0]["curve"]]
        ax1.plot(x, 100 * y, marker="o", label=a)
        ax2.plot(steps, 100 * y, marker="o", label=a)
    if summary.get("target") is not None:
        for ax in (ax1, ax2):
            ax.axhline(100 * summary["target"], color="grey", ls="--", lw=0.8, label="target")
    ax1.set_xlabel("generated tokens (mean over seeds)")
    ax2.set_xlabel("learner steps")
    for ax in (ax1, ax2):
        ax.set_ylabel(f"held-out accuracy, {metric} (%)")
        ax.grid(alpha=0.3)
    ax1.legend()
    ax1.set_title("accuracy against generation")
    ax2.set_title("accuracy against learner steps (equal B)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(summary: dict) -> None:
    def ci(c: dict, scale: float = 1.0, fmt: str = ".2f") -> str:
        if c.get("mean") is None:
            return "n/a"
        lo, hi = c["ci"]
        m = c["mean"] * scale
        if math.isnan(lo):
            return f"{m:{fmt}}"
        return f"{m:{fmt}} [{lo * scale:{fmt}}, {hi * scale:{fmt}}]"

    target = summary["target"]
    print(
        f"\n{summary['metric']}: start {100 * summary['start']:.1f}%, target "
        f"{'none' if target is None else f'{100 * target:.1f}%'}; ratios and differences "
        f"paired with {BASELINE}, 95% intervals"
    )
    print(f"{'arm':<17} {'reached':>8} {'tokens/target':>22} {'rollouts/target':>22} "
          f"{'tokens/step':>22} {'final diff (pts)':>24}")  # fmt: skip
    for a, r in summary["arms"].items():
        n = len(r["seeds"])
        print(
            f"{a:<17} {r['reached']:>4}/{n:<3} {ci(r['tokens_ratio']):>22} "
            f"{ci(r['rollouts_ratio']):>22} {ci(r['tokens_per_step_ratio']):>22} "
            f"{ci(r['final_diff'], 100.0, '+.1f'):>24}"
        )


def seeds_of(text: str) -> list[int]:
    """``0-9`` or ``0,1,2``."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in text.split(",")]


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arms", default=",".join(ARMS), help=f"from {', '.join(ARMS)}")
    p.add_argument("--seeds", default="0-9", help="'0-9' or '0,1,2' (default 0-9)")
    p.add_argument("--quick", action="store_true", help="tiny smoke settings (minutes)")
    p.add_argument("--out", default=None, help="output path stem")
    p.add_argument("--cache", default=os.environ.get("IB_CACHE", "/tmp/dynamo_ib_cache"))
    p.add_argument("--metric", default="sampled", choices=("sampled", "greedy"))
    p.add_argument("--target-frac", type=float, default=0.8)
    p.add_argument("--jobs", type=int, default=1, help="runs at the same time (one process each)")
    p.add_argument("--run-one", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    for f in Settings.__dataclass_fields__.values():
        if f.name != "extra":
            p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None)
    args = p.parse_args(argv)
    s = Settings()
    if args.quick:
        s = Settings(
            train_prompts=64, task_train=1564, warm_steps=300, steps=4, batch_size=4, draw=4,
            eval_every=2, eval_subset=50, test_prompts=100,
        )  # fmt: skip
    for name in Settings.__dataclass_fields__:
        v = getattr(args, name, None)
        if v is not None and name != "extra":
            setattr(s, name, v)
    unknown = set(args.arms.split(",")) - set(ARMS)
    if unknown:
        p.error(f"--arms: unknown {sorted(unknown)}; known: {', '.join(ARMS)}")
    if BASELINE not in args.arms.split(","):
        p.error(f"--arms must include the baseline {BASELINE!r}")
    return args, s


def main(argv: list[str] | None = None) -> int:
    args, s = parse(argv)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    if args.run_one:
        arm, seed = args.run_one[0], int(args.run_one[1])
        run_one(arm, seed, s, se.warm_start(s, cache), Path(args.result))
        return 0
    arms = args.arms.split(",")
    seeds = seeds_of(args.seeds)
    t0 = time.time()
    warm = se.warm_start(s, cache)
    print(f"warm start ready: {warm} ({time.time() - t0:.0f}s)", flush=True)
    forwarded = list(argv if argv is not None else sys.argv[1:])
    tasks = []
    for seed in seeds:  # seed-major: a partial benchmark has every arm on its first seeds
        for a in arms:
            res = cache / f"ib-{s.key()}-{a}-{seed}.json"
            cmd = [sys.executable, __file__, *forwarded, "--run-one", a, str(seed)]
            tasks.append(([*cmd, "--result", str(res)], res))
    se.run_children(tasks, args.jobs)
    runs = [
        json.loads((cache / f"ib-{s.key()}-{a}-{seed}.json").read_text())
        for seed in seeds
        for a in arms
    ]
    summary = {m: summarise(runs, arms, m, args.target_frac) for m in ("sampled", "greedy")}
    default = (
        cache / "quick" / "informative_batch" if args.quick else se.RESULTS / "informative_batch"
    )
    out = Path(args.out) if args.out else default
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(
        out.with_suffix(".json"),
        {
            "what": "generation to fill equal learner batches of groups with a signal, "
            "in-process (see the module docstring)",
            "settings": asdict(s),
            "arms": {a: asdict(ARMS[a]) for a in arms},
            "baseline": BASELINE,
            "seeds": seeds,
            "target_frac": args.target_frac,
            "summary": summary,
            "runs": runs,
            "wall_s": time.time() - t0,
        },
        separators=(",", ":"),
    )
    plot(runs, arms, out.with_suffix(".png"), args.metric, summary[args.metric])
    for m in ("sampled", "greedy"):
        print_table(summary[m])
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
