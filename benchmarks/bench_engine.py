"""Embedded engine throughput against ``model.generate`` on the same model and batch.

Builds a ~10M-parameter Qwen2 (the tiny-model builder with hidden 256, 10 layers), starts a real
``dynamo-rl engine`` process on a free port, and times 64 prompts x 64 new tokens (sampling at
temperature 1, ``ignore_eos`` so every sequence makes all 64 tokens, log-probs returned):

- engine, one request: ``/v1/completions`` with the 64 prompts as a list;
- engine, 64 requests: one request per prompt sent at once (how a rollout worker calls it);
- baseline: ``model.generate`` in this process on the same 64 prompts (``do_sample``, no top-k/top-p,
  ``min_new_tokens`` = 64), with the same number of torch threads as the engine.

Engine and baseline runs alternate so load on a shared machine hits both alike. Prints tokens/s
(median of ``--repeats``) and the ratio engine / baseline (target >= 0.8: serving costs little).

    .venv/bin/python benchmarks/bench_engine.py [--threads 1 --repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, engine and baseline")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import httpx
    import torch
    from transformers import AutoModelForCausalLM

    from dynamo_rl.service_table import SERVICES
    from learner.tiny_model import build_tiny_model

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    model_dir = build_tiny_model(
        tmp / "model",
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 64,
        num_kv_heads=2,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    n_params = sum(p.numel() for p in model.parameters())

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc, url = SERVICES["engine"].start(
        tmp / "engine.log", "--model", str(model_dir), f"engine.threads={args.threads}",
        f"engine.max_batch_size={args.prompts}", "engine.register_in_redis=false",
        "run.log_level=warning", env=env, timeout=180,
    )  # fmt: skip
    try:
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(3, 259, (args.prompts, args.prompt_len), generator=gen)
        prompt_lists = prompts.tolist()
        from dynamo_rl.contracts.engine import CompletionRequest

        def body(prompt: list[int] | list[list[int]]) -> dict[str, Any]:
            return CompletionRequest(
                prompt=prompt, max_tokens=args.new_tokens, temperature=1.0, ignore_eos=True,
                logprobs=0, return_token_ids=True,
            ).body()  # fmt: skip

        client = httpx.Client(timeout=600)

        def engine_one_request() -> int:
            r = client.post(f"{url}/v1/completions", json=body(prompt_lists))
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        pool = ThreadPoolExecutor(args.prompts)

        def engine_many_requests() -> int:
            def one(p: list[int]) -> int:
                r = client.post(f"{url}/v1/completions", json=body(p))
                r.raise_for_status()
                return int(r.json()["usage"]["completion_tokens"])

            return sum(pool.map(one, prompt_lists))

        @torch.inference_mode()
        def baseline() -> int:
            out = model.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=0,
            )
            return int((out.shape[1] - prompts.shape[1]) * out.shape[0])

        runs = {
            "engine, 1 request": engine_one_request,
            "engine, 64 requests": engine_many_requests,
        }
        runs["model.generate"] = baseline
        rates: dict[str, list[float]] = {k: [] for k in runs}
        for fn in runs.values():  # warm-up
            fn()
        for _ in range(args.repeats):
            for name, fn in runs.items():
                t0 = time.perf_counter()
                tokens = fn()
                dt = time.perf_counter() - t0
                assert tokens == args.prompts * args.new_tokens, (name, tokens)
                rates[name].append(tokens / dt)
    finally:
        proc.stop()

    print(
        f"model: {n_params / 1e6:.1f}M parameters (hidden {args.hidden}, {args.layers} layers), "
        f"{args.prompts} prompts x {args.new_tokens} new tokens, prompt length "
        f"{args.prompt_len}, {args.threads} torch thread(s), median of {args.repeats}"
    )
    base = statistics.median(rates["model.generate"])
    for name, values in rates.items():
        med = statistics.median(values)
        print(
            f"  {name:22s} {med:9.0f} tokens/s  (min {min(values):.0f}, max {max(values):.0f})"
            f"  ratio to model.generate {med / base:.2f}"
        )
    ratio = statistics.median(rates["engine, 1 request"]) / base
    best = max(rates["engine, 1 request"]) / max(rates["model.generate"])
    print(
        f"engine/baseline ratio: {ratio:.2f} median, {best:.2f} best-of-{args.repeats} "
        "(target >= 0.8)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
