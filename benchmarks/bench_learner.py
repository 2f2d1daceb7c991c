"""Learner step time and its split, and weight-push throughput against a memcpy of the same bytes.

Two parts, each with real processes (a Redis-protocol server, ``torchrun`` with 2 gloo ranks, and for
the push a real ``dynamo-rl engine``):

- ``step``: a ~10M-parameter Qwen2 (tiny-model builder, hidden 384, 5 layers) trained on synthetic
  trajectory groups (``--groups`` × ``--responses`` responses of ``--response-len`` tokens) with the
  DynaMO recipe (modulation on); prints the mean step time over the steps after the first and its
  split into read / forward / backward / optimizer, plus tokens/s.
- ``gradstats``: the step of ``step`` with ``allocator.method=grad``, so the learner measures
  and writes each prompt's gradient statistic (``learner/grad_report.py``); prints its own time
  as a share of the step (goal < 5%) and the step time against a run without it.
- ``push``: a ~100M-parameter model (hidden 768, 12 layers); the learner pushes after each step to
  one embedded engine over the torch.distributed group (rank 0 gathers the FSDP shards bucket by
  bucket and broadcasts them). Prints the push seconds and GB/s of the best push, and the same
  bytes copied in this process with ``torch.Tensor.copy_`` (memcpy baseline) and the ratio.

    .venv/bin/python benchmarks/bench_learner.py [--part step|push|gradstats|all]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from _learner_bench import child_env, memcpy_gbps, run_logged  # noqa: E402


def _groups(n: int, responses: int, length: int, seed: int = 0) -> list:
    import random

    from dynamo_rl.codec import Response, TrajectoryGroup

    rng = random.Random(seed)
    out = []
    for g in range(n):
        resp = [
            Response(
                token_ids=[rng.randrange(3, 259) for _ in range(length)],
                logprobs=[-5.5] * length,
                reward=float((g + r) % 2),
                correct=bool((g + r) % 2),
            )
            for r in range(responses)
        ]
        prompt = [rng.randrange(3, 259) for _ in range(32)]
        out.append(TrajectoryGroup(prompt_id=f"p{g}", prompt_token_ids=prompt, responses=resp))
    return out


def _run_learner(model: Path, run_dir: Path, url: str, name: str, steps: int, extra: list[str]):
    from dynamo_rl.service_table import SERVICES

    argv = SERVICES["learner"].argv(
        f"learner.model={model}", f"run.name={name}", f"run.dir={run_dir}",
        f"endpoints.redis_url={url}", "learner.metrics_port=null",
        f"learner.max_steps={steps}", "learner.checkpoint.every=1000",
        "learner.checkpoint.export_every=0", "learner.stream.wait_timeout_s=60",
        "learner.lr=1e-5", "learner.algorithm.modulation.enabled=true",
        "learner.algorithm.policy_loss.clip_high=0.28",
        *extra, nproc=2,
    )  # fmt: skip
    run_logged(argv, run_dir.parent / f"{name}.log", "learner", child_env())
    from learner.steplog import read_log

    return read_log(run_dir / "metrics.jsonl")


def _step_records(root: Path, url: str, args: argparse.Namespace, name: str, extra: list[str]):
    """The step records of a ``--steps``-step run of the ~10M model on fresh synthetic groups."""
    from learner.tiny_model import build_tiny_model
    from tests.learner.helpers import write_groups

    model = root / "m10"
    if not model.exists():
        build_tiny_model(model, hidden_size=384, num_layers=5, num_heads=6)
    steps = args.steps
    write_groups(url, name, _groups(args.groups * steps, args.responses, args.response_len))
    return _run_learner(
        model, root / name, url, name, steps,
        [f"learner.train_batch_size={args.groups}", "learner.micro_batch_size=8",
         "learner.push.every=0", *extra],
    )  # fmt: skip


def _mean(records: list[dict], key: str) -> float:
    rest = records[1:] or records  # the first step warms up
    return statistics.mean(r.get(key, 0.0) for r in rest)


def bench_step(root: Path, url: str, args: argparse.Namespace) -> None:
    records = _step_records(root, url, args, "bstep", [])
    n_params = _count(root / "m10")
    steps = args.steps
    mean = {k: _mean(records, k) for k in (
        "time_step", "time_read", "time_forward", "time_backward", "time_optimizer",
        "tokens_per_second")}  # fmt: skip
    print(f"step: {n_params / 1e6:.1f}M params, 2 ranks (gloo, CPU), "
          f"{args.groups} groups x {args.responses} responses x {args.response_len} tokens")  # fmt: skip
    print(f"  step time (mean of steps 2..{steps}): {mean['time_step']:.3f} s")
    for phase in ("read", "forward", "backward", "optimizer"):
        share = mean[f"time_{phase}"] / mean["time_step"]
        print(f"    {phase:<9} {mean[f'time_{phase}']:.3f} s ({share:.0%})")
    print(f"  trained tokens/s: {mean['tokens_per_second']:.0f}")


def bench_gradstats(root: Path, url: str, args: argparse.Namespace) -> None:
    """The gradient statistic's cost (``allocator.method=grad``): its own time per step (hooks,
    reduction, Redis write: the step record's ``time_grad_stats``) against the step's, and the
    step time with it against a run without it (noisier: two runs on a shared machine)."""
    off = _step_records(root, url, args, "gs-off", [])
    on = _step_records(root, url, args, "gs-on", ["allocator.method=grad"])
    own = [r["time_grad_stats"] / r["time_step"] for r in (on[1:] or on)]
    t_off, t_on = _mean(off, "time_step"), _mean(on, "time_step")
    print(f"gradient statistic: {args.groups} groups x {args.responses} responses x "
          f"{args.response_len} tokens, 2 ranks, steps 2..{args.steps}")  # fmt: skip
    print(f"  its own time: {_mean(on, 'time_grad_stats') * 1e3:.1f} ms a step = "
          f"{statistics.mean(own):.2%} of the step (max {max(own):.2%}; goal < 5%)")  # fmt: skip
    print(f"  step time without / with it: {t_off:.3f} s / {t_on:.3f} s (ratio {t_on / t_off:.3f})")
    print(f"  prompts reported a step: {_mean(on, 'grad_stats_prompts'):.0f}")


def bench_push(root: Path, url: str, args: argparse.Namespace) -> None:
    import httpx

    from dynamo_rl.service_table import SERVICES
    from learner.tiny_model import build_tiny_model
    from tests.learner.helpers import write_groups

    model = build_tiny_model(root / "m100", hidden_size=768, num_layers=12, num_heads=12)
    n_params = _count(model)
    engine, engine_url = SERVICES["engine"].start(
        root / "engine.log", "--model", str(model), "run.name=bpush", f"endpoints.redis_url={url}",
        env=child_env(), cwd=REPO, timeout=300,
    )  # fmt: skip
    try:
        write_groups(url, "bpush", _groups(args.push_steps, 2, 8))
        records = _run_learner(
            model, root / "bpush", url, "bpush", args.push_steps,
            ["learner.train_batch_size=1", "learner.push.every=1",
             "learner.push.fallback_to_disk=false"],
        )  # fmt: skip
        version = httpx.get(f"{engine_url}/get_weight_version").json()
    finally:
        engine.stop()
    ok = [r for r in records if r.get("push_ok")]
    if len(ok) != len(records) or version["weight_version"] != args.push_steps:
        raise SystemExit(f"a push failed: {records} engine {version}")
    best = min(ok, key=lambda r: r["push_seconds"])
    nbytes = best["push_gb_per_s"] * best["push_seconds"] * 1e9
    memcpy = memcpy_gbps(int(nbytes))  # the same bytes, one same-process copy
    print(f"push: {n_params / 1e6:.1f}M params ({nbytes / 1e6:.0f} MB float32), 2 learner ranks "
          f"-> 1 embedded engine, gloo over loopback, {len(ok)} pushes")  # fmt: skip
    print(f"  push (gather shards + broadcast + engine load), best: {best['push_seconds']:.3f} s, "
          f"{best['push_gb_per_s']:.2f} GB/s; median "
          f"{statistics.median(r['push_seconds'] for r in ok):.3f} s")  # fmt: skip
    print(
        f"    split: gather shards {best['push_gather_seconds']:.3f} s, broadcast "
        f"{best['push_send_seconds']:.3f} s ({nbytes / best['push_send_seconds'] / 1e9:.2f} GB/s), "
        f"engine answer after the last tensor {best['push_answer_seconds']:.3f} s"
    )
    print(
        f"  memcpy of the same bytes in one process: {nbytes / memcpy / 1e9:.3f} s, {memcpy:.2f} GB/s"
    )
    print(f"  ratio push / memcpy throughput: {best['push_gb_per_s'] / memcpy:.3f}")


def _count(model_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118


def _prod(shape: list[int]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["step", "push", "gradstats", "all"], default="all")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--responses", type=int, default=8)
    ap.add_argument("--response-len", type=int, default=64)
    ap.add_argument("--push-steps", type=int, default=3)
    args = ap.parse_args()
    from dynamo_rl.procs import start_redis

    with tempfile.TemporaryDirectory(prefix="bench-learner-") as tmp:
        root = Path(tmp)
        redis, url = start_redis(root / "redis")
        try:
            if args.part in ("step", "all"):
                bench_step(root, url, args)
            if args.part in ("push", "all"):
                bench_push(root, url, args)
            if args.part in ("gradstats", "all"):
                bench_gradstats(root, url, args)
        finally:
            redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
