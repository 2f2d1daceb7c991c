"""Sampling throughput of a real vLLM server against the embedded engine, same model, same requests.

Builds the quickstart's tiny Qwen2 model (``up.tiny_model``'s defaults), starts both servers the
way ``dynamo-rl up`` does — the ``engine`` row of :data:`dynamo_rl.service_table.SERVICES` (the
embedded engine) and its ``vllm`` row (``dynamo-rl vllm-server``, from ``engine.vllm.python``,
default ``.venv-vllm/bin/python``) — and times the same batch on each: ``--prompts`` prompts of
``--prompt-len`` random tokens, one ``/v1/completions`` request per prompt with ``n``
(``--n``) samples of ``--new-tokens`` tokens (temperature 1, ``ignore_eos`` so every sample makes
all of them, log-probs and token ids returned, as the rollout worker asks), all requests sent at
once. After one warm-up batch each, the servers alternate ``--repeats`` times (load on a shared
machine hits both alike); prints tokens/s per server (median, min, max) and the ratio vLLM /
embedded.

    .venv/bin/python benchmarks/bench_vllm.py [--repeats 5 --prompts 64 --n 8 --new-tokens 32]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (one request each)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vllm-python", default=".venv-vllm/bin/python",
                    help="interpreter of the vLLM environment (engine.vllm.python)")  # fmt: skip
    ap.add_argument("--start-timeout", type=float, default=900.0, help="seconds for each start")
    args = ap.parse_args()

    import httpx
    import torch

    from dynamo_rl.config.up import TinyModelConfig
    from dynamo_rl.service_table import SERVICES
    from learner.tiny_model import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    tm = TinyModelConfig()
    model_dir = build_tiny_model(
        tmp / "model", hidden_size=tm.hidden_size, num_layers=tm.num_layers,
        num_heads=tm.num_heads, num_kv_heads=tm.num_kv_heads, seed=0,
    )  # fmt: skip
    common = ["--model", str(model_dir), "engine.register_in_redis=false",
              f"run.dir={tmp / 'run'}", "run.log_level=warning"]  # fmt: skip
    # As up runs them: one torch thread for the embedded engine, vLLM its own binding.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    servers = {}
    try:
        servers["embedded"] = SERVICES["engine"].start(
            tmp / "engine.log", *common, f"engine.max_batch_size={args.prompts * args.n}",
            env=env, timeout=args.start_timeout,
        )  # fmt: skip
        t0 = time.monotonic()
        servers["vllm"] = SERVICES["vllm"].start(
            tmp / "vllm.log", *common, "engine.kind=vllm",
            f"engine.vllm.python={Path(args.vllm_python).absolute()}",
            f"engine.vllm.max_model_len={args.prompt_len + args.new_tokens + 16}",
            env=env, timeout=args.start_timeout,
        )  # fmt: skip
        print(f"vLLM ready in {time.monotonic() - t0:.0f}s (logs in {tmp})", flush=True)

        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(3, 259, (args.prompts, args.prompt_len), generator=gen).tolist()
        client = httpx.Client(timeout=900)
        pool = ThreadPoolExecutor(args.prompts)

        from dynamo_rl.contracts.engine import CompletionRequest

        def batch(url: str, model: str) -> int:
            def one(i: int) -> int:
                body = CompletionRequest(
                    model=model, prompt=prompts[i], n=args.n, max_tokens=args.new_tokens,
                    temperature=1.0, seed=i, ignore_eos=True, logprobs=0, return_token_ids=True,
                )  # fmt: skip
                r = client.post(f"{url}/v1/completions", json=body.body())
                r.raise_for_status()
                return sum(len(c["token_ids"]) for c in r.json()["choices"])

            return sum(pool.map(one, range(args.prompts)))

        names = {
            kind: client.get(f"{url}/v1/models").json()["data"][0]["id"]
            for kind, (_proc, url) in servers.items()
        }
        want = args.prompts * args.n * args.new_tokens
        rates: dict[str, list[float]] = {k: [] for k in servers}
        for kind, (_proc, url) in servers.items():  # warm-up (vLLM's first requests are slow)
            batch(url, names[kind])
        for _ in range(args.repeats):
            for kind, (_proc, url) in servers.items():
                t = time.perf_counter()
                tokens = batch(url, names[kind])
                dt = time.perf_counter() - t
                assert tokens == want, (kind, tokens, want)
                rates[kind].append(tokens / dt)
    finally:
        for proc, _url in servers.values():
            proc.stop(grace=20)

    print(
        f"tiny Qwen2 (hidden {tm.hidden_size}, {tm.num_layers} layers), "
        f"{args.prompts} prompts x n={args.n} x {args.new_tokens} tokens, prompt length "
        f"{args.prompt_len}, median of {args.repeats}"
    )
    for kind, values in rates.items():
        print(f"  {kind:9s} {statistics.median(values):8.0f} tokens/s  "
              f"(min {min(values):.0f}, max {max(values):.0f})")  # fmt: skip
    ratio = statistics.median(rates["vllm"]) / statistics.median(rates["embedded"])
    print(f"vllm/embedded ratio: {ratio:.2f} (median over median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
