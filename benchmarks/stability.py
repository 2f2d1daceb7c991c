"""Stability under pressure: GRPO against DynaMO's modulation alone, where the PPO ratio leaves 1.

``benchmarks/sample_efficiency.py`` trains on-policy with one update per batch, so the ratio
π/π_old is 1 and modulation's stability factor has nothing to act on. Here every batch is
**sampled by a policy ``staleness`` steps old** and trained for **``epochs`` passes over
``mini_batches`` mini-batches** (one optimizer step each), as the learner does with
``ppo_epochs`` / ``mini_batch_size`` and a stream of stale samples. The update *is* the learner's
step (``learner.step.RLStep`` with those settings): the old log-probs are its old pass under the
current weights at batch start, the sampling policy's log-probs (reported by its generation)
give truncated importance weights ``min(exp(old − sampling), is_cap)`` (the learner's
``is_cap``). The learning rate is swept above the stable one.

Methods: ``grpo`` (uniform n, GRPO advantages, PPO-clip token-mean) and ``mod`` (the same plus
``dynamo_modulate``, preset decay6, per micro-batch). Everything else — task, warm start, sampling,
scorer, evaluation — is ``benchmarks/sample_efficiency.py``'s, imported from it.

Per run the JSON holds, per RL step: the policy's mean token entropy on the batch's tokens over
the step's update passes (``entropy``; at batch start: ``entropy_start``), every optimizer step's
pre-clip gradient norm, the clip fractions and ratio means, the IS weights'
mean; and held-out accuracy at the start and the end. A (method, learning rate) is **stable** when on
every seed (i) its final sampled held-out accuracy is at least the warm start's minus
``--max-drop`` (2 points) and (ii) its entropy has not collapsed nor exploded: the mean token
entropy (over the update passes) of the last four steps lies within a factor ``--entropy-band`` (4) of the first step's.
Gradient-norm spikes (optimizer steps whose pre-clip norm exceeds ``--spike-factor`` (5) × the
median of that run's first RL step, which is the same warm-start batch for every learning rate)
are reported but do not decide stability.

    .venv/bin/python benchmarks/stability.py --quick     # smoke run (minutes)
    .venv/bin/python benchmarks/stability.py --jobs 2    # the figures in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from _machine import write_result  # noqa: E402 - the result file, with its machine
from sample_efficiency import (  # noqa: E402
    RESULTS,
    UPDATE_FIELDS,
    Settings,
    evaluate,
    learner_config,
    learner_step,
    load,
    method_specs,
    run_children,
    sampled_batch,
    t_interval,
    task_rows,
    warm_start,
)

METHODS = ("grpo", "mod")


@dataclass
class StabSettings:
    """The pressure and the sweep (hashed into the cache key with the task ``Settings``)."""

    lrs: str = "3e-5,1e-4,3e-4,1e-3"
    seeds: str = "0"
    steps: int = 16
    epochs: int = 2
    """Passes over each batch (the learner's ``ppo_epochs``)."""
    mini_batches: int = 4
    """Mini-batches per batch, each one optimizer step (whole groups each)."""
    staleness: int = 2
    """Batches are sampled by the policy this many RL steps old (the warm start before that)."""
    is_cap: float = 2.0
    """Truncated IS weight cap (the shipped recipes' ``is_cap``); 0 turns the correction off."""
    max_drop: float = 0.02
    entropy_band: float = 4.0
    spike_factor: float = 5.0

    def key(self, s: Settings) -> str:
        import hashlib

        mine = {k: v for k, v in asdict(self).items() if k not in ("lrs", "seeds")}  # per run
        blob = json.dumps([mine, asdict(s)], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def algo_for(method: str, s: Settings, st: StabSettings):
    """The learner's algorithm for ``method``: PPO-clip with dual clip, token-mean, IS cap."""
    from dynamo_rl.config.learner import AlgorithmConfig, ModulationConfig, PpoLoss

    spec = method_specs(s.decay)[method]
    return AlgorithmConfig(
        policy_loss=PpoLoss(clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=10.0),
        agg="token-mean",
        modulation=ModulationConfig(enabled=spec.modulate, preset=s.preset),
        is_cap=st.is_cap or None,
    )


def run_one(method: str, lr: float, seed: int, s: Settings, st: StabSettings, warm: Path,
            out_file: Path) -> None:  # fmt: skip
    import numpy as np
    import torch

    torch.set_num_threads(1)
    rl_pool, _, test = task_rows(s)
    eval_rows = test[: s.eval_subset]
    model, tok = load(warm)
    sampler, _ = load(warm)
    sampler.eval()
    history = deque([copy.deepcopy(model.state_dict())], maxlen=st.staleness + 1)
    lc = learner_config(s, algo_for(method, s, st), groups=s.batch_size, lr=lr, epochs=st.epochs,
                        mini_batches=st.mini_batches)  # fmt: skip
    step_fn = learner_step(model, tok, lc)
    rng = np.random.default_rng(seed)
    order: list[int] = []
    log: list[dict[str, Any]] = []
    t0 = time.time()
    start = evaluate(model, tok, eval_rows, s, seed)
    print(f"[{method} lr {lr:g} s{seed}] start {start}", flush=True)
    for step in range(1, st.steps + 1):
        if len(order) < s.batch_size:
            order += rng.permutation(len(rl_pool)).tolist()
        batch, order = order[: s.batch_size], order[s.batch_size :]
        group_of = [g for g in range(s.batch_size) for _ in range(s.n)]
        # Sample with the policy `staleness` steps old (the oldest one kept).
        sampler.load_state_dict(history[0])
        torch.manual_seed(seed * 1_000_003 + step)
        step_batch, rewards = sampled_batch(
            sampler, tok, s, [rl_pool[i] for i in batch], group_of, [str(i) for i in batch]
        )
        # The learner's step: its old pass under the current weights, IS weights against the
        # sampling policy's log-probs, ``epochs`` passes of ``mini_batches`` optimizer steps.
        model.train()
        rec = step_fn(step_batch).record
        history.append(copy.deepcopy(model.state_dict()))
        log.append(
            {
                "step": step,
                "reward": float(rewards.mean()),
                # the policy's entropy at batch start (the old pass); "entropy" below is the
                # token-weighted mean over the update passes
                "entropy_start": rec["entropy"],
                "entropy": rec["entropy_update"],
                "is_weight_mean": rec["is_weight_mean"],
                "grad_norms": rec["grad_norms"],
                **{
                    k: rec[k]
                    for k in UPDATE_FIELDS
                    if k in rec and k not in ("entropy", "grad_norm")
                },
            }
        )
        if step % 8 == 0 or step == st.steps:
            last = log[-1]
            print(
                f"[{method} lr {lr:g} s{seed}] step {step} reward {last['reward']:.3f} "
                f"entropy {last['entropy']:.3f} gnorm max {max(last['grad_norms']):.2f} "
                f"clip {last.get('clip_frac_upper', 0) + last.get('clip_frac_lower', 0):.3f} "
                f"({time.time() - t0:.0f}s)",
                flush=True,
            )
    final = evaluate(model, tok, eval_rows, s, seed)
    print(f"[{method} lr {lr:g} s{seed}] final {final} ({time.time() - t0:.0f}s)", flush=True)
    out_file.write_text(
        json.dumps(
            {
                "method": method,
                "lr": lr,
                "seed": seed,
                "start": start,
                "final": final,
                "log": log,
                "wall_s": time.time() - t0,
            }
        )
    )


# ---------------------------------------------------------------------------------------------
# Summary


def run_verdict(run: dict, st: StabSettings) -> dict[str, Any]:
    """One run's figures and whether it was stable (see the module docstring)."""
    import numpy as np

    log = run["log"]
    first = log[0]["entropy"]
    last = float(np.mean([r["entropy"] for r in log[-4:]]))
    ref = float(np.median(log[0]["grad_norms"]))
    norms = [g for r in log for g in r["grad_norms"]]
    spikes = sum(g > st.spike_factor * ref for g in norms)
    drop = run["start"]["sampled"] - run["final"]["sampled"]
    ratio = last / first if first > 0 else float("nan")
    clip = [r.get("clip_frac_upper", 0.0) + r.get("clip_frac_lower", 0.0) for r in log]
    entropy_ok = 1 / st.entropy_band <= ratio <= st.entropy_band
    return {
        "final_sampled": run["final"]["sampled"],
        "final_greedy": run["final"]["greedy"],
        "start_sampled": run["start"]["sampled"],
        "accuracy_drop": drop,
        "entropy_first": first,
        "entropy_last4": last,
        "entropy_ratio": ratio,
        "grad_norm_ref": ref,
        "grad_norm_max_ratio": max(norms) / ref if ref > 0 else float("nan"),
        "grad_norm_spikes": spikes,
        "optimizer_steps": len(norms),
        "clipfrac_mean": float(np.mean(clip)),
        "clipfrac_dual_mean": float(np.mean([r.get("clip_frac_dual", 0.0) for r in log])),
        "stable": bool(drop <= st.max_drop and entropy_ok),
    }


def summarise(runs: list[dict], st: StabSettings) -> dict[str, Any]:
    lrs = sorted({r["lr"] for r in runs})
    out: dict[str, Any] = {}
    for m in METHODS:
        rows = {}
        for lr in lrs:
            mine = sorted((r for r in runs if r["method"] == m and r["lr"] == lr),
                          key=lambda r: r["seed"])  # fmt: skip
            if not mine:
                continue
            v = [run_verdict(r, st) for r in mine]
            rows[f"{lr:g}"] = {
                "lr": lr,
                "seeds": [r["seed"] for r in mine],
                "stable": all(x["stable"] for x in v),
                "final_sampled": t_interval([x["final_sampled"] for x in v]),
                "entropy_ratio": t_interval([x["entropy_ratio"] for x in v]),
                "clipfrac_mean": t_interval([x["clipfrac_mean"] for x in v]),
                "grad_norm_spikes": [x["grad_norm_spikes"] for x in v],
                "grad_norm_max_ratio": [x["grad_norm_max_ratio"] for x in v],
                "per_seed": v,
            }
        stable = [r["lr"] for r in rows.values() if r["stable"]]
        out[m] = {"by_lr": rows, "largest_stable_lr": max(stable) if stable else None}
    return out


def plot(summary: dict, path: Path, st: StabSettings, s: Settings) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("final_sampled", "final held-out accuracy, sampled (%)", 100.0),
        ("entropy_ratio", "entropy, last 4 steps / first step", 1.0),
        ("clipfrac_mean", "clip fraction (upper + lower)", 1.0),
        ("grad_norm_max_ratio", "max grad norm / first step's median", 1.0),
    )
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.5))
    for ax, (key, label, scale) in zip(axes, panels, strict=True):
        finite: list[float] = []
        for m, res in summary.items():
            xs, ys, lrs, mean = [], [], [], []
            for row in res["by_lr"].values():
                vals = [v[key] * scale for v in row["per_seed"] if math.isfinite(v[key])]
                xs += [row["lr"]] * len(vals)
                ys += vals
                if vals:
                    lrs.append(row["lr"])
                    mean.append(sum(vals) / len(vals))
            ax.scatter(xs, ys, label=m, alpha=0.7)
            ax.plot(lrs, mean)
            finite += ys
        if finite:  # a log axis needs data (a smoke run's untrained model has no gradient)
            ax.set_xscale("log")
            if key == "grad_norm_max_ratio" and min(finite) > 0:
                ax.set_yscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(
        f"stability: {st.epochs} epochs × {st.mini_batches} mini-batches per batch, staleness "
        f"{st.staleness}, is_cap {st.is_cap}; {s.batch_size} prompts × {s.n}, {st.steps} steps; "
        "points = seeds, lines = means",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Driver


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Settings, StabSettings]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny smoke settings (minutes)")
    p.add_argument("--out", default=None, help="output stem (default results/stability)")
    p.add_argument("--cache", default=os.environ.get("SE_CACHE", "/tmp/dynamo_se_cache"))
    p.add_argument("--jobs", type=int, default=1, help="runs at the same time (one process each)")
    p.add_argument("--run-one", nargs=3, metavar=("METHOD", "LR", "SEED"), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    for f in StabSettings.__dataclass_fields__.values():
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None)
    for name in ("eval_subset", "batch_size", "n", "micro_batch", "warm_steps"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    args = p.parse_args(argv)
    s = Settings(eval_subset=300)
    st = StabSettings()
    if args.quick:
        s = Settings(task_train=400, test_prompts=50, warm_steps=20, warm_tiers="easy,medium",
                     train_prompts=32, batch_size=4, n=4, eval_subset=50)  # fmt: skip
        st = StabSettings(lrs="1e-3,1e-2", seeds="0", steps=3, epochs=2, mini_batches=2)
    for name in StabSettings.__dataclass_fields__:
        if getattr(args, name) is not None:
            setattr(st, name, getattr(args, name))
    for name in ("eval_subset", "batch_size", "n", "micro_batch", "warm_steps"):
        if getattr(args, name) is not None:
            setattr(s, name, getattr(args, name))
    if st.staleness < 0 or st.epochs < 1 or st.mini_batches < 1:
        raise SystemExit("--staleness must be >= 0, --epochs and --mini-batches >= 1")
    return args, s, st


def main(argv: list[str] | None = None) -> int:
    args, s, st = parse(argv)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    if args.run_one:
        method, lr, seed = args.run_one[0], float(args.run_one[1]), int(args.run_one[2])
        run_one(method, lr, seed, s, st, warm_start(s, cache), Path(args.result))
        return 0
    t0 = time.time()
    warm_start(s, cache)
    lrs = [float(x) for x in st.lrs.split(",")]
    seeds = [int(x) for x in st.seeds.split(",")]
    forwarded = list(argv if argv is not None else sys.argv[1:])
    tasks, files = [], []
    for seed in seeds:
        for lr in lrs:
            for m in METHODS:
                res = cache / f"stab-{st.key(s)}-{m}-{lr:g}-{seed}.json"
                cmd = [sys.executable, __file__, *forwarded, "--run-one", m, repr(lr), str(seed)]
                tasks.append(([*cmd, "--result", str(res)], res))
                files.append(res)
    run_children(tasks, args.jobs)
    runs = [json.loads(f.read_text()) for f in files]
    summary = summarise(runs, st)
    default = cache / "quick" / "stability" if args.quick else RESULTS / "stability"
    out = Path(args.out) if args.out else default
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "what": "GRPO vs modulation-only under stale, multi-epoch updates (module docstring)",
        "settings": asdict(st),
        "task_settings": asdict(s),
        "summary": summary,
        "runs": runs,
        "wall_s": time.time() - t0,
    }
    write_result(out.with_suffix(".json"), report, indent=1)
    plot(summary, out.with_suffix(".png"), st, s)
    print_table(summary)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


def print_table(summary: dict) -> None:
    print(
        "\n| method | lr | stable | final sampled % (per seed) | entropy last/first | clip "
        "fraction | grad-norm spikes | max grad norm / ref |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for m, res in summary.items():
        for row in res["by_lr"].values():
            v = row["per_seed"]
            print(
                f"| {m} | {row['lr']:g} | {'yes' if row['stable'] else 'no'} | "
                + ", ".join(f"{x['final_sampled'] * 100:.1f}" for x in v)
                + " | "
                + ", ".join(f"{x['entropy_ratio']:.2f}" for x in v)
                + " | "
                + ", ".join(f"{x['clipfrac_mean']:.3f}" for x in v)
                + " | "
                + ", ".join(str(x["grad_norm_spikes"]) for x in v)
                + " | "
                + ", ".join(f"{x['grad_norm_max_ratio']:.1f}" for x in v)
                + " |"
            )
        print(f"largest stable lr, {m}: {res['largest_stable_lr']}")


if __name__ == "__main__":
    raise SystemExit(main())
