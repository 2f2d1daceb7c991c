"""The rollout loop's groups/s end to end, and what the loop costs on top of generation.

Starts real processes on free ports — Redis, ``dynamo-rl engine`` (a tiny Qwen2 built from a config),
``dynamo-rl allocator`` and ``dynamo-rl reward`` — and runs a rollout worker in this process over a
verl-layout arithmetic dataset:

- loop: ``--batches`` batches of ``--batch-size`` prompts, n = ``--n`` on average (DRA counts),
  ``--max-tokens`` new tokens each: gates, Allocate, generate, /v1/verify, ReportOutcomes, XADD;
- baseline: the same prompts and counts sent straight to the engine through the same replica pool
  and request split, nothing else (no allocator, reward service or Redis).

Prints groups/s, responses/s and generated tokens/s of the loop, its time per phase, and the ratio
loop tokens/s ÷ baseline tokens/s (1.0 = the loop adds nothing to generation; the rest is
allocation, verification and the push, which the worker does not overlap with generation).
Nothing here asserts a time.

    .venv/bin/python benchmarks/bench_rollout.py [--batches 3 --batch-size 16 --n 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import pyarrow as pa
    import pyarrow.parquet as pq

    from dynamo_rl.config import load_config
    from dynamo_rl.procs import ServiceProcess, start_redis
    from dynamo_rl.service_table import SERVICES
    from learner.tiny_model import build_tiny_model
    from services.rollout.worker import build_worker

    tmp = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    model = build_tiny_model(
        tmp / "model",
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=max(1, args.hidden // 64),
        num_kv_heads=1,
    )
    rows = [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"{i % 97}+{i // 97}="}],
            "reward_model": {"ground_truth": str(i % 97 + i // 97)},
            "extra_info": {"index": i},
        }
        for i in range(args.batch_size * args.batches)
    ]
    data = tmp / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)

    procs: list[ServiceProcess] = []

    def start(name: str, *args: str) -> str:
        proc, address = SERVICES[name].start(tmp / f"{name}.log", *args, cwd=ROOT, timeout=180)
        procs.append(proc)
        return address

    redis_proc, redis_url = start_redis(tmp / "redis")
    procs.append(redis_proc)
    try:
        engine = start("engine", "--model", str(model))
        alloc = start("allocator", "--redis-url", redis_url)
        reward = start("reward", "--math-workers", "1", "reward.code.enabled=false")
        cfg = load_config(
            None,
            [
                f"endpoints.redis_url={redis_url}", f"endpoints.engine_urls=[{engine}]",
                f"endpoints.reward_url={reward}", f"endpoints.allocator_addr={alloc}",
                f"rollout.dataset={data}", f"rollout.tokenizer={model}",
                f"rollout.batch_size={args.batch_size}", f"rollout.n={args.n}",
                f"rollout.n_min={max(1, args.n // 2)}", f"rollout.n_max={args.n * 2}",
                f"rollout.sampling.max_tokens={args.max_tokens}", "rollout.shuffle=false",
                "rollout.max_pending_groups=0",
                # The allocator in the loop, as before uniform became the default.
                "rollout.allocation=dynamic", "learner.algorithm.agg=prompt-mean",
            ],
            env={},
        )  # fmt: skip
        worker = build_worker(cfg)
        return asyncio.run(_measure(worker, args))
    finally:
        for proc in reversed(procs):
            proc.stop()


async def _measure(worker, args) -> int:
    from services.rollout.worker import split_count

    try:
        await worker.run_batch(-1)  # warm-up: connections, tokenizer, model name, first batch
        reg = worker.metrics.metrics.registry

        def phase_sums() -> dict[str, float]:
            return {
                phase: reg.get_sample_value("dynamo_rollout_batch_seconds_sum", {"phase": phase})
                or 0.0
                for phase in ("allocate", "generate", "verify", "push", "total")
            }

        warm = phase_sums()

        async def generation_only(r) -> tuple[int, float]:
            """The same prompts and counts as batch ``r``, generation only."""
            t0 = time.perf_counter()
            out = await asyncio.gather(
                *(
                    worker.pool.generate(list(g.prompt_token_ids), size, worker.sampling)
                    for g in r.groups
                    for size in split_count(len(g.responses), worker.cfg.max_n_per_request)
                )
            )
            return sum(len(s.token_ids) for part in out for s in part), time.perf_counter() - t0

        # Loop and baseline alternate batch by batch so load on a shared machine hits both alike.
        results, walls = [], []
        base_tokens, base_s = 0, 0.0
        for b in range(args.batches):
            t0 = time.perf_counter()
            results.append(await worker.run_batch(b))
            walls.append(time.perf_counter() - t0)
            n_tok, seconds = await generation_only(results[-1])
            base_tokens += n_tok
            base_s += seconds
        groups = sum(len(r.groups) for r in results)
        responses = sum(len(g.responses) for r in results for g in r.groups)
        tokens = sum(len(x.token_ids) for r in results for g in r.groups for x in g.responses)
        loop_s = sum(walls)

        sums = {k: v - warm[k] for k, v in phase_sums().items()}
        print(
            f"rollout loop: {args.batches} batches x {args.batch_size} prompts, n={args.n} (DRA), "
            f"max_tokens={args.max_tokens}, model hidden {args.hidden} x {args.layers} layers, "
            f"engine threads {args.threads}"
        )
        print(f"  groups/s           {groups / loop_s:8.2f}   ({groups} groups in {loop_s:.2f}s)")
        print(f"  responses/s        {responses / loop_s:8.2f}")
        print(f"  tokens/s           {tokens / loop_s:8.1f}")
        print(f"  batch wall (median){statistics.median(walls):8.3f}s")
        for phase in ("allocate", "generate", "verify", "push"):
            share = 100 * sums[phase] / (sums["total"] or 1)
            print(f"  phase {phase:9s}    {sums[phase]:8.3f}s  ({share:5.1f}%)")
        base_rate = base_tokens / base_s if base_s else 0.0
        print(f"baseline (generation only, same prompts and counts): {base_rate:8.1f} tokens/s")
        ratio = (tokens / loop_s) / base_rate if base_rate else float("nan")
        print(f"ratio loop / generation-only tokens/s: {ratio:.2f}")
    finally:
        await worker.aclose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
