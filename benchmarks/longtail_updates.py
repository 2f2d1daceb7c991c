"""Waiting vs interruptible weight updates on a long-tailed task, through ``dynamo-rl up``.

    .venv/bin/python benchmarks/longtail_updates.py                  # seeds 0-2, both modes
    .venv/bin/python benchmarks/longtail_updates.py --seeds 0 --quick  # smoke run (tiny settings)
    .venv/bin/python benchmarks/longtail_updates.py --engine vllm --seeds 0  # a vLLM CPU server
    .venv/bin/python benchmarks/longtail_updates.py --mix task  # a fifth of the responses long

The task is ``up.task=longtail`` (``tasks/longtail.py``): most questions are short sums answered
with the boxed sum alone, a fifth are chains of one-digit numbers answered with the running sum
worked out — reference responses over ten times longer. Per seed, the ``wait`` run goes first
(building and warm-starting the tiny model); the ``interrupt`` run starts from that same
warm-started model, so the pair differs only in ``rollout.update_mode``, at the same staleness
bounds (``rollout.max_staleness`` and ``learner.stream.max_staleness``). Both runs use three
rollout workers and the embedded engine's continuous batching (``engine.batching``), so requests
keep arriving while a long response decodes: under ``wait`` a push stops the joining and waits
for the running batch to drain; under ``interrupt`` it lands at the next token boundary.

From each run folder:

- **trained tokens/s**: the tokens the learner trained on over the RL wall time (from the start of
  its first step to the end of its last, ``metrics.jsonl``);
- **learner idle share**: the share of that time the learner waited — for a batch to fill
  (``time_read``) and for its weight push (``time_push``: with waiting updates a push waits for the
  longest generation in flight);
- **engine idle share**: one minus the share of the same window the engine spent decoding
  batches (``dynamo_engine_batch_seconds`` in its metrics history, ``metrics/engine-*.jsonl``,
  between the snapshots that bracket the window: ``run.history.interval_s`` is its resolution);
- **response lengths** of the pushed responses (the worker's sample log), to show the tail;
- **held-out accuracy** after RL (``summary.json``, ``up``'s evaluation on the test split).

Written to ``--out`` (default ``benchmarks/results/<name>.json``, the name ``longtail_updates``
with ``_vllm`` for ``--engine vllm`` and ``_taskmix`` for ``--mix task``; with ``--quick``,
``/tmp/<name>_quick.json``; run folders in ``runs/<name>``) with a plot beside it (same name,
``.png``): per seed both
runs' figures and the ratios interrupt / wait; across seeds the paired differences with 95% t
intervals (``sample_efficiency.paired``). Runs through the services are not bit-reproducible
(batches depend on timing), and the shared development machine's load moves the throughput
figures: compare the ratios of one seed's pair, run back to back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import write_result  # noqa: E402 - the result file, with its machine
from sample_efficiency import paired  # noqa: E402 - the seed-paired t interval, shared

CONFIG = REPO / "configs" / "quickstart.yaml"
MODES = ("wait", "interrupt")
# The long-tail task on the quickstart's services, DynaMO's dynamic allocation included. The tiny
# model at hidden 128 is warm-started until its greedy exact match on 32 held-out rows per tier
# averages 0.45 (the worked chains may stay unlearned: min_tier_accuracy 0), so held-out accuracy
# is away from the floor. Three rollout workers keep requests in flight while a long response
# decodes, the engine batches continuously (they join the running batch), and the learner pushes
# after every step: what a push waits for under `wait` is the drain of the running batch. With
# 2,400 questions the long ones are over half (the short tier has only 900 distinct sums) and
# the allocation gives them more samples still: most responses in flight are long.
COMMON = [
    "up.task=longtail", "up.task_train=2000", "up.task_test=400",
    "up.tiny_model.hidden_size=128", "up.tiny_model.num_layers=2", "up.tiny_model.num_heads=4",
    "up.tiny_model.num_kv_heads=2",
    "up.warm_start.steps=1500", "up.warm_start.batch_size=32", "up.warm_start.tiers=[short,long]",
    "up.warm_start.check_rows=32", "up.warm_start.target_exact=0.45",
    "up.warm_start.min_tier_accuracy=0",
    "up.eval.prompts=400", "up.eval.samples=1", "up.rollout_workers=3",
    "engine.batching=continuous",
    "rollout.sampling.max_tokens=160", "rollout.batch_size=8", "rollout.n=4", "rollout.n_min=2",
    "rollout.n_max=8", "rollout.max_n_per_request=8", "allocator.n_per_prompt=4",
    "allocator.n_min=2", "allocator.n_max=8", "rollout.max_pending_groups=16",
    "rollout.max_staleness=1", "learner.stream.max_staleness=4",
    "learner.train_batch_size=8", "learner.max_steps=40", "learner.lr=3e-5",
    "learner.checkpoint.every=100",
    "run.history.interval_s=1",
]  # fmt: skip
# --mix task: the responses at the task's designed mix, a fifth long — 600 + 300 questions (the
# short tier is not exhausted) and uniform n (no allocation toward the long, harder questions).
TASK_MIX = [
    "up.task_train=600", "up.task_test=300", "up.eval.prompts=300", "rollout.allocation=uniform",
]  # fmt: skip
# engine.kind=vllm: the CPU build (head size 32: the build has no kernel for 8 or 16), unseeded
# (vLLM 0.32's CPU engine dies on seeded requests prefilled in chunks), with time to start.
VLLM = [
    "engine.kind=vllm", "engine.vllm.max_model_len=256", "up.health_timeout_s=900",
    "rollout.sampling.seed=null", "up.tiny_model.hidden_size=128", "up.tiny_model.num_heads=4",
    "up.tiny_model.num_kv_heads=2",
]  # fmt: skip
# Tiny settings for a smoke run: every stage runs, a few minutes on an idle machine.
QUICK = [
    "up.task_train=400", "up.task_test=40", "up.tiny_model.hidden_size=32",
    "up.tiny_model.num_layers=1", "up.tiny_model.num_heads=2", "up.tiny_model.num_kv_heads=1",
    "up.warm_start.steps=60", "up.eval.prompts=40", "up.eval.samples=1",
    "learner.max_steps=8",
]  # fmt: skip


def run_dir_of(runs: Path, mode: str, seed: int) -> Path:
    return runs / f"{mode}-seed{seed}"


def up(run_dir: Path, mode: str, seed: int, settings: list[str], model: str | None) -> None:
    """``dynamo-rl up`` for one (mode, seed), unless its ``summary.json`` exists."""
    if (run_dir / "summary.json").exists():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "dynamo_rl.cli", "up", "--config", str(CONFIG),
            f"run.seed={seed}", f"run.dir={run_dir}", f"run.name=longtail-{mode}-{seed}",
            *settings, f"rollout.update_mode={mode}",
            *([f"learner.model={model}", f"engine.model={model}"] if model else [])]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    print(f"{mode} seed {seed}: {run_dir}", flush=True)
    with open(run_dir / "up.log", "w") as log:
        code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    (run_dir / "load_average_1m_after").write_text(f"{os.getloadavg()[0]:.1f}\n")
    if code != 0:
        raise SystemExit(f"{mode} seed {seed}: up exited {code}; see {run_dir / 'up.log'}")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def engine_busy_s(run_dir: Path, t0: float, t1: float) -> tuple[float, float]:
    """Seconds the engines spent decoding from the snapshot before ``t0`` to the one after ``t1``
    (unix), and the seconds those snapshots span (both summed over engines). The embedded engine
    times its batches; for vLLM a snapshot interval counts as busy when the snapshot that ends
    it has requests running (``vllm:num_requests_running``)."""
    busy = covered = 0.0
    for path in sorted((run_dir / "metrics").glob("engine-*.jsonl")):
        points, t_prev, running = [], None, 0.0
        for rec in _jsonl(path):
            names = {name: v for name, _labels, v in rec["samples"]}
            if "vllm:num_requests_running" in names:
                if t_prev is not None and names["vllm:num_requests_running"] > 0:
                    running += rec["t"] - t_prev
                t_prev = rec["t"]
                points.append((rec["t"], running))
                continue
            total = sum(v for name, _labels, v in rec["samples"]
                        if name == "dynamo_engine_batch_seconds_sum")  # fmt: skip
            points.append((rec["t"], total))
        # The snapshots that bracket the window (the history's interval is its resolution).
        first = max((p for p in points if p[0] <= t0), default=points[0] if points else None)
        last = min((p for p in points if p[0] >= t1), default=points[-1] if points else None)
        if first is not None and last is not None and last[0] > first[0]:
            busy += last[1] - first[1]
            covered += last[0] - first[0]
    return busy, covered


def sample_lengths(run_dir: Path) -> list[int]:
    """Response lengths (tokens) of every response the workers pushed."""
    out: list[int] = []
    for path in sorted((run_dir / "samples").glob("*.jsonl")):
        for group in _jsonl(path):
            out += [int(r["tokens"]) for r in group.get("responses", [])]
    return out


def measure(run_dir: Path, mode: str, seed: int) -> dict:
    steps = [r for r in _jsonl(run_dir / "metrics.jsonl") if r.get("kind") != "eval"]
    if not steps:
        raise SystemExit(f"{run_dir}: the learner logged no step")
    t0 = steps[0]["time_unix"] - steps[0]["time_step"]
    t1 = steps[-1]["time_unix"]
    wall = t1 - t0
    read = sum(r.get("time_read", 0.0) for r in steps)
    push = sum(r.get("time_push", 0.0) for r in steps)
    tokens = sum(r["tokens"] for r in steps)
    busy, covered = engine_busy_s(run_dir, t0, t1)
    summary = json.loads((run_dir / "summary.json").read_text())
    lengths = sorted(sample_lengths(run_dir))
    spread = [r.get("version_spread_max", 0) for r in steps]
    return {
        "mode": mode,
        "seed": seed,
        "run_dir": str(run_dir.relative_to(REPO) if run_dir.is_relative_to(REPO) else run_dir),
        "steps": len(steps),
        "rl_wall_s": round(wall, 1),
        "trained_tokens": tokens,
        "trained_tokens_per_s": round(tokens / wall, 2),
        "learner_idle_share": round((read + push) / wall, 4),
        "learner_read_share": round(read / wall, 4),
        "learner_push_share": round(push / wall, 4),
        "engine_idle_share": round(1 - busy / covered, 4) if covered else None,
        "response_len": {
            "n": len(lengths),
            "min": lengths[0] if lengths else None,
            "median": lengths[len(lengths) // 2] if lengths else None,
            "max": lengths[-1] if lengths else None,
        },
        "version_spread_max": max(spread),
        "staleness_max": max(r.get("staleness_max", 0) for r in steps),
        "accuracy_before": summary.get("accuracy_before"),
        "accuracy_after": summary.get("accuracy_after"),
        "up_wall_s": summary.get("wall_s"),
        # The machine's load when the run ended (None: a run from before this was recorded).
        "load_average_1m_after": _load_after(run_dir),
    }


def _load_after(run_dir: Path) -> float | None:
    path = run_dir / "load_average_1m_after"
    return float(path.read_text()) if path.exists() else None


RATIOS = ("trained_tokens_per_s", "learner_idle_share", "engine_idle_share")


def summarise(runs: list[dict]) -> dict:
    by = {(r["mode"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    pairs = [(by[("wait", s)], by[("interrupt", s)]) for s in seeds]
    ratios = [
        {"seed": w["seed"], **{k: round(i[k] / w[k], 3) if w[k] else None for k in RATIOS}}
        for w, i in pairs
    ]
    out: dict = {"ratios_interrupt_over_wait": ratios}
    for key in ("accuracy_after", *RATIOS):
        out[f"paired_{key}_interrupt_minus_wait"] = paired(
            {i["seed"]: i[key] for _, i in pairs}, {w["seed"]: w[key] for w, _ in pairs}
        )
    return out


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    seeds = sorted({r["seed"] for r in runs})
    panels = [("trained_tokens_per_s", "trained tokens / s"),
              ("learner_idle_share", "learner idle share"),
              ("engine_idle_share", "engine idle share"),
              ("accuracy_after", "held-out accuracy after RL")]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.4))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for j, mode in enumerate(MODES):
            xs = [s + (j - 0.5) * 0.38 for s in seeds]
            ys = [next((r[key] or 0) for r in runs if r["mode"] == mode and r["seed"] == s)
                  for s in seeds]  # fmt: skip
            ax.bar(xs, ys, 0.36, color=f"C{j}", label=mode)
        ax.set_xticks(seeds)
        ax.set_xlabel("run.seed")
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7, title="rollout.update_mode", title_fontsize=7, loc="lower right")
    fig.suptitle(doc["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run.seed values")
    p.add_argument("--runs", type=Path, default=None, help="run folders (default: runs/<name>)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="tiny settings (a smoke run)")
    p.add_argument("--engine", choices=["embedded", "vllm"], default="embedded")
    p.add_argument(
        "--mix",
        choices=["dynamic", "task"],
        default="dynamic",
        help="dynamic: DynaMO's allocation on 2,400 questions (most responses long); task: "
        "uniform n on 900 questions (a fifth of the responses long)",
    )
    p.add_argument(
        "--vllm-python",
        default=str(REPO / ".venv-vllm" / "bin" / "python"),
        help="--engine vllm: the vLLM environment's python (engine.vllm.python)",
    )
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    name = ("longtail_updates" + ("_vllm" if args.engine == "vllm" else "")
            + ("_taskmix" if args.mix == "task" else ""))  # fmt: skip
    default = f"/tmp/{name}_quick.json" if args.quick else (
        REPO / "benchmarks" / "results" / f"{name}.json")  # fmt: skip
    runs_dir = args.runs or REPO / "runs" / name
    settings = [*COMMON, *(TASK_MIX if args.mix == "task" else []), *(QUICK if args.quick else [])]
    if args.engine == "vllm":
        settings += [*VLLM, f"engine.vllm.python={args.vllm_python}"]
    out = Path(args.out or default)
    t_start = time.time()
    runs = []
    for seed in seeds:
        first = run_dir_of(runs_dir, "wait", seed)
        up(first, "wait", seed, settings, None)
        model = first / "model" / ("sft" if (first / "model" / "sft").exists() else "init")
        up(run_dir_of(runs_dir, "interrupt", seed), "interrupt", seed, settings, str(model))
        runs += [measure(run_dir_of(runs_dir, m, seed), m, seed) for m in MODES]
    doc = {
        "title": f"update_mode wait vs interrupt on the longtail task ({args.engine} engine, "
        f"{args.mix} mix), seeds {args.seeds}" + (" (--quick)" if args.quick else ""),
        "settings": settings,
        # What the runs took (``up``'s wall time, summed), whenever they ran; and this call.
        "wall_s": round(sum(r["up_wall_s"] or 0.0 for r in runs), 1),
        "call_s": round(time.time() - t_start, 1),
        "runs": runs,
        **summarise(runs),
    }
    write_result(out, doc, indent=2)
    plot(doc, out.with_suffix(".png"))
    print(json.dumps(doc["ratios_interrupt_over_wait"], indent=2))
    print(f"written {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
