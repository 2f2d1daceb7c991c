"""On-policy distillation against RL, through ``dynamo-rl up --config configs/distill.yaml``: three
arms from the same student start, paired by seed, and held-out accuracy against the tokens each
arm generated.

    .venv/bin/python benchmarks/distill.py --teacher runs/teacher/export/final   # seeds 0-2
    .venv/bin/python benchmarks/distill.py            # trains the teacher first: the quickstart,
                                                      # run.seed=0, into <runs>/teacher
    .venv/bin/python benchmarks/distill.py --quick    # smoke run (tiny settings)

The arms (``ARMS``): ``rl``, the reward alone (``opd.weight`` 0, ``outcome_weight`` 1; the teacher
still scores, so its reverse KL is recorded); ``opd``, distillation alone (the config as shipped:
``weight`` 1, ``outcome_weight`` 0); ``mixed``, both (``outcome_weight`` 1). Each seed's ``rl``
run warm-starts the student; the other two arms copy its ``model/`` folder (the same student
start, so their held-out accuracy before is the same figure) once its evaluation before RL is
written. Every run exports the policy every 20 steps (``learner.checkpoint.export_every``); each
export is then evaluated like ``up``'s own evaluation (``dynamo-rl eval --model``, the same
prompts, samples and temperature). A run's curve is held-out accuracy against the generated
tokens the learner's step records count up to that step (kept and dropped).

What it reports, per seed and over seeds: each arm's accuracy before and after; for ``opd`` and
``mixed``, the generated tokens at the first export whose accuracy reaches the ``rl`` arm's final
accuracy, as a share of all the tokens ``rl`` generated (null when never reached: the aim is at
most 1/3); the final accuracy minus ``rl``'s with a 95% t interval. Runs go to
``<runs>/<arm>-seed<N>``; a finished run (``summary.json``) or evaluation is read, not redone.
Written to ``--out`` (default ``benchmarks/results/distill.json``; with ``--quick``,
``/tmp/distill_quick.json``) with a plot beside it (``.png``). Runs through the services are not
bit-reproducible (batch composition depends on timing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from quickstart_seeds import result_of, start, write_with_plot  # noqa: E402 - one way to run up
from sample_efficiency import paired  # noqa: E402 - seed-paired t intervals, shared

CONFIG = REPO / "configs" / "distill.yaml"
TEACHER_CONFIG = REPO / "configs" / "quickstart.yaml"
ARMS = {
    "rl": ["learner.algorithm.opd.weight=0", "learner.algorithm.opd.outcome_weight=1"],
    "opd": [],
    "mixed": ["learner.algorithm.opd.outcome_weight=1"],
}


def eval_argv(run_dir: Path, model: Path, out: Path) -> list[str]:
    """``up``'s held-out evaluation (its prompts, samples and temperature) of ``model``, on an
    engine and a reward service of its own."""
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    ev = cfg["up"]["eval"]
    return [sys.executable, "-m", "dynamo_rl.cli", "eval", "--config", str(run_dir / "config.yaml"),
            "--model", str(model), "--data", str(run_dir / "data" / "test.parquet"),
            "--limit", str(ev["prompts"]), "--n", str(ev["samples"]),
            "--temperature", str(ev["temperature"]), "--out", str(out)]  # fmt: skip


def exports(run_dir: Path) -> list[tuple[int, Path]]:
    """The run's periodic exports (``export/step_NNNNNN``), by step."""
    found = [(int(p.name.split("_")[1]), p) for p in (run_dir / "export").glob("step_*")]
    return sorted(found)


def cumulative_tokens(run_dir: Path) -> dict[int, int]:
    """Generated tokens (kept and dropped) summed over the learner's steps up to each step."""
    total, out = 0, {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line) if line.strip() else {}
        if "gen_tokens_kept" in r:
            total += r["gen_tokens_kept"] + r["gen_tokens_dropped"]
            out[int(r["step"])] = total
    return out


def curve(run_dir: Path) -> list[dict]:
    """Held-out accuracy against generated tokens: before RL (0 tokens), each export, and after
    (the run's final weights, ``up``'s evaluation after)."""
    tokens = cumulative_tokens(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    points = [{"step": 0, "gen_tokens": 0, "accuracy": summary["accuracy_before"]}]
    for step, _ in exports(run_dir):
        result = run_dir / f"eval_step_{step:06d}.json"
        if result.exists() and step in tokens:
            acc = json.loads(result.read_text())["accuracy"]
            points.append({"step": step, "gen_tokens": tokens[step], "accuracy": acc})
    last = max(tokens)
    if points[-1]["step"] != last:
        points.append({"step": last, "gen_tokens": tokens[last],
                       "accuracy": summary["accuracy_after"]})  # fmt: skip
    return points


def tokens_to_reach(points: list[dict], target: float) -> int | None:
    """Generated tokens at the first point whose accuracy is at least ``target`` (None: never)."""
    return next((p["gen_tokens"] for p in points if p["accuracy"] >= target), None)


def reverse_kl(run_dir: Path) -> dict:
    """The step records' ``opd_reverse_kl``: first, last and the mean of the last ten steps."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    kl = [r["opd_reverse_kl"] for r in map(json.loads, filter(str.strip, lines))
          if "opd_reverse_kl" in r]  # fmt: skip
    if not kl:
        return {}
    return {"first": round(kl[0], 4), "last": round(kl[-1], 4),
            "last10_mean": round(sum(kl[-10:]) / len(kl[-10:]), 4)}  # fmt: skip


class Plan:
    """The runs and evaluations still to do, each started when it can be and a slot is free."""

    def __init__(self, runs: Path, seeds: list[int], teacher: Path, quick: bool) -> None:
        self.runs, self.teacher, self.quick = runs, teacher, quick
        self.todo = [(arm, s) for s in seeds for arm in ARMS]
        self.evals: list[tuple[Path, Path, Path]] = []  # (run dir, model, result file)

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.runs / f"{arm}-seed{seed}"

    def ready(self, arm: str, seed: int) -> bool:
        """``rl`` at once; the others once the seed's ``rl`` run has its student start and its
        evaluation before RL (then its ``model/`` is complete), copied into their folders."""
        if arm == "rl":
            return True
        rl = self.run_dir("rl", seed)
        return (rl / "eval_before.json").exists() or (rl / "summary.json").exists()

    def start_run(self, arm: str, seed: int) -> subprocess.Popen | None:
        run_dir = self.run_dir(arm, seed)
        if (run_dir / "summary.json").exists():
            self.queue_evals(run_dir)
            return None
        if arm != "rl" and not (run_dir / "model").exists():
            shutil.copytree(self.run_dir("rl", seed) / "model", run_dir / "model")
        overrides = [*ARMS[arm], f"up.teacher.model={self.teacher}"]
        print(f"{arm} seed {seed}: starting {run_dir}", flush=True)
        return start(run_dir, overrides, seed, self.quick, CONFIG)

    def queue_evals(self, run_dir: Path) -> None:
        """Each export's evaluation, but the last step's: ``up``'s evaluation after RL is it."""
        last = max(cumulative_tokens(run_dir))
        for step, model in exports(run_dir):
            out = run_dir / f"eval_step_{step:06d}.json"
            if step < last and not out.exists():
                self.evals.append((run_dir, model, out))

    def next_job(self) -> tuple[str, subprocess.Popen, Path | None] | None:
        """The next job started: (its name, its process, its run folder; None for an eval)."""
        while self.evals:  # evaluations first: they free their slot sooner
            run_dir, model, out = self.evals.pop(0)
            log = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - closed with the process
            env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
            proc = subprocess.Popen(eval_argv(run_dir, model, out), stdout=log,
                                    stderr=subprocess.STDOUT, cwd=REPO, env=env)  # fmt: skip
            return f"eval {out}", proc, None
        for i, (arm, seed) in enumerate(self.todo):
            if self.ready(arm, seed):
                del self.todo[i]
                proc = self.start_run(arm, seed)
                if proc is None:
                    return self.next_job()
                return f"{arm} seed {seed}", proc, self.run_dir(arm, seed)
        return None

    def execute(self, jobs: int) -> None:
        running: dict[str, tuple[subprocess.Popen, Path | None]] = {}
        while self.todo or self.evals or running:
            while len(running) < jobs and (job := self.next_job()) is not None:
                name, proc, run_dir = job
                running[name] = (proc, run_dir)
            for name, (proc, run_dir) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                if proc.returncode != 0:
                    where = run_dir / "up.log" if run_dir else name.split()[1][:-5] + ".log"
                    raise SystemExit(f"{name}: exited {proc.returncode}; see {where}")
                print(f"{name}: done", flush=True)
                if run_dir is not None:
                    self.queue_evals(run_dir)
            time.sleep(2)


def ensure_teacher(runs: Path, quick: bool) -> Path:
    """The quickstart, run.seed=0, into ``<runs>/teacher`` (unless done): its final export."""
    run_dir = runs / "teacher"
    final = run_dir / "export" / "final"
    if not (run_dir / "summary.json").exists():
        print(f"training the teacher: the quickstart into {run_dir}", flush=True)
        proc = start(run_dir, [], 0, quick, TEACHER_CONFIG)
        if proc.wait() != 0:
            raise SystemExit(f"the teacher's run exited {proc.returncode}; see {run_dir}/up.log")
    return final


def summarise(runs: list[dict]) -> dict:
    """Per seed and over seeds: each arm's final accuracy against ``rl``'s, and the tokens the
    distilling arms needed to reach ``rl``'s final accuracy as a share of ``rl``'s."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs if r["arm"] == "rl"})
    out: dict = {}
    for arm in ("opd", "mixed"):
        share: dict[int, float | None] = {}
        for s in seeds:
            rl, other = by.get(("rl", s)), by.get((arm, s))
            if rl and other:
                reached = tokens_to_reach(other["curve"], rl["accuracy_after"])
                total = rl["curve"][-1]["gen_tokens"]
                share[s] = None if reached is None else round(reached / total, 4)
        mine = {s: 100 * by[(arm, s)]["accuracy_after"] for s in seeds if (arm, s) in by}
        theirs = {s: 100 * by[("rl", s)]["accuracy_after"] for s in seeds}
        p = paired(mine, theirs)
        out[arm] = {
            "tokens_to_rl_final_share": share,
            "reached_within_a_third": {s: v is not None and v <= 1 / 3 for s, v in share.items()},
            "accuracy_after_minus_rl": {"mean": p["mean"], "ci95": p["ci"], "seeds": p["seeds"],
                                        "per_seed": {s: round(mine[s] - theirs[s], 2)
                                                     for s in p["seeds"]}},
        }  # fmt: skip
    return out


def plot(runs: list[dict], path: Path) -> None:
    """Held-out accuracy against generated tokens, one panel per seed, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({r["seed"] for r in runs})
    fig, axes = plt.subplots(1, len(seeds), figsize=(4 * len(seeds), 3.6), squeeze=False)
    for ax, seed in zip(axes[0], seeds, strict=True):
        for j, arm in enumerate(ARMS):
            r = next((r for r in runs if r["arm"] == arm and r["seed"] == seed), None)
            if r is None:
                continue
            xs = [p["gen_tokens"] / 1e6 for p in r["curve"]]
            ys = [100 * p["accuracy"] for p in r["curve"]]
            ax.plot(xs, ys, marker="o", ms=3, color=f"C{j}", label=arm)
            if arm == "rl":
                ax.axhline(ys[-1], color=f"C{j}", ls=":", lw=1)
        ax.set_title(f"seed {seed}")
        ax.set_xlabel("generated tokens (millions)")
    axes[0][0].set_ylabel("held-out accuracy (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Distillation vs RL through dynamo-rl up (dotted: RL's final accuracy)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="run.seed values (default 0,1,2)")
    p.add_argument("--teacher", help="the teacher's HF folder (default: train one, see above)")
    p.add_argument("--jobs", type=int, default=2, help="runs and evaluations at once (default 2)")
    p.add_argument("--runs", default="runs/distill", help="folder of the run folders")
    p.add_argument("--out", help="result JSON (see above for the default)")
    p.add_argument("--quick", action="store_true", help="tiny smoke settings")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    out = Path(args.out or ("/tmp/distill_quick.json" if args.quick else
                            REPO / "benchmarks" / "results" / "distill.json"))  # fmt: skip
    runs_dir = Path(args.runs).resolve()
    teacher = Path(args.teacher).resolve() if args.teacher else ensure_teacher(runs_dir, args.quick)
    if not (teacher / "config.json").exists():
        raise SystemExit(f"--teacher {teacher}: not a Hugging Face model folder")
    plan = Plan(runs_dir, seeds, teacher, args.quick)
    plan.execute(max(1, args.jobs))
    teacher_eval = runs_dir / "teacher_eval.json"
    if not teacher_eval.exists():
        subprocess.run(eval_argv(plan.run_dir("rl", seeds[0]), teacher, teacher_eval), check=True,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       stdout=subprocess.DEVNULL)  # fmt: skip
    runs = []
    for seed in seeds:
        for arm in ARMS:
            run_dir = plan.run_dir(arm, seed)
            r = {"arm": arm, **result_of(run_dir, arm, seed, [])}
            r.pop("method")
            r |= {"curve": curve(run_dir), "opd_reverse_kl": reverse_kl(run_dir)}
            runs.append(r)
            pts = ", ".join(f"{p['gen_tokens'] / 1e6:.2f}M {100 * p['accuracy']:.1f}%"
                            for p in r["curve"])  # fmt: skip
            print(f"{arm} seed {seed}: {pts}")
    doc = {
        "command": "dynamo-rl up --config configs/distill.yaml run.seed=N up.teacher.model=T "
                   "<arm's overrides>",
        "arms": ARMS,
        "teacher": {"model": str(teacher),
                    "accuracy": json.loads(teacher_eval.read_text())["accuracy"]},
        "quick": args.quick,
        "note": "through the real services; not bit-reproducible (batch composition depends on "
                "timing); each curve point is up's held-out evaluation of an export",
        "summary": summarise(runs),
        "runs": runs,
    }  # fmt: skip
    for arm, s in doc["summary"].items():
        acc = s["accuracy_after_minus_rl"]
        print(f"{arm}: tokens to reach rl's final accuracy, share of rl's: "
              f"{s['tokens_to_rl_final_share']}; final accuracy minus rl: {acc['mean']:+.2f} "
              f"points, 95% {acc['ci95']}")  # fmt: skip
    write_with_plot(out, doc, lambda png: plot(runs, png))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
