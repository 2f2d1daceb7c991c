"""LoRA (``learner.lora``, rank 16) against full fine-tuning on a ~100M-parameter model, in one run:
the learner's peak memory, its optimizer-state bytes, and the weight push's bytes and seconds.

The model is the tiny Qwen2 config scaled up (hidden 768, 12 layers, as ``bench_push.py``;
``--quick``: hidden 256, 4 layers). Each variant runs in a process of its own (so its peak
resident memory is its own), as the learner builds it: the policy loaded in float32, LoRA adapters
injected (rank 16, alpha 32, q/k/v/o projections) or not, FSDP2 on one gloo rank (CPU), AdamW over
the parameters that train; ``--steps`` train steps (forward, backward, optimizer step) on a fixed
batch of ``--batch`` x ``--seq`` tokens; then ``--pushes`` pushes to one real embedded engine
(``dynamo-rl engine``) — full weights through the learner's ``DistributedPush`` (vLLM-shaped,
flat buckets), the adapters through its ``AdapterPush`` (a peft folder the engine loads under a
versioned name); the first push (group forming, first load) is left out, the best of the rest
reported.

- peak memory: the process's peak resident set (``ru_maxrss``) after the steps, and its growth
  over the resident set right after loading the model (what training added);
- optimizer state: bytes of every tensor in AdamW's state;
- push: bytes moved and seconds of the best push.

The ratios are LoRA / full (aim for the push time: at most 0.05).

    .venv/bin/python benchmarks/bench_lora.py [--steps 2] [--pushes 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from _learner_bench import child_env, run_logged  # noqa: E402

RANK, ALPHA = 16, 32.0


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


# ---- one variant, in its own process ------------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    import datetime
    import time

    import torch
    import torch.distributed as dist

    from dynamo_rl.config.learner import LoraConfig
    from dynamo_rl.contracts.weight_control import weight_protocol
    from dynamo_rl.procs import free_port
    from learner.adapter_push import AdapterPush
    from learner.lora import adapter_tensors, add_adapters, write_adapter
    from learner.model import full_policy_state, load_policy, shard
    from learner.push import DistributedPush

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=600))  # fmt: skip
    torch.manual_seed(0)
    policy = load_policy(args.model)
    lc = LoraConfig(enabled=True, rank=RANK, alpha=ALPHA)
    if args.variant == "lora":
        add_adapters(policy.lm, lc, args.model)
    model = shard(policy, torch.device("cpu"), torch.float32)
    loaded_mb = _current_rss_mb()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 259, (args.batch, args.seq), generator=gen)
    mask = torch.ones_like(ids)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        logits, _ = model(ids, mask, args.seq // 2)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, -args.seq // 2 :].reshape(-1)
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    step_s = (time.perf_counter() - t0) / args.steps
    peak_mb = _rss_mb()
    opt_bytes = sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for t in state.values()
        if torch.is_tensor(t)
    )
    protocol = weight_protocol("vllm")
    if args.variant == "lora":
        root = Path(args.out).parent / "adapters"

        def export(version: int) -> str:
            tensors = adapter_tensors(full_policy_state(model, trainable_only=True))
            return str(write_adapter(tensors, lc, args.model, root / f"adapter_v{version:06d}"))

        push = AdapterPush(export, prefix="policy", protocol=protocol, timeout_s=300.0)
    else:
        push = DistributedPush(master_address="127.0.0.1", bucket_mb=256.0, timeout_s=300.0,
                               protocol=protocol)  # fmt: skip
    pushes = []
    try:
        for version in range(1, args.pushes + 1):
            r = push.push(model, version, [args.url])
            if not r.ok:
                raise SystemExit(f"{args.variant}: push {version} failed: {r.error}")
            pushes.append({"bytes": r.bytes, "seconds": r.seconds, "gather": r.gather_seconds})
    finally:
        push.close()
    best = min(pushes[1:] or pushes, key=lambda r: r["seconds"])
    record = {
        "trainable": sum(p.numel() for p in params),
        "params": sum(p.numel() for p in model.parameters()),
        "loaded_mb": loaded_mb, "peak_mb": peak_mb, "optimizer_bytes": opt_bytes,
        "step_s": step_s, "push_bytes": best["bytes"], "push_s": best["seconds"],
        "push_gather_s": best["gather"],
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(record))
    dist.destroy_process_group()
    return 0


# ---- the driver ---------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="train steps per variant")
    ap.add_argument("--pushes", type=int, default=3, help="per variant; the first is left out")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--seq", type=int, default=64, help="tokens per sequence (half response)")
    ap.add_argument("--quick", action="store_true", help="a ~4M-parameter model")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--variant", "--model", "--url", "--out"):  # the driver's call of a variant
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from bench_push import _model

    from dynamo_rl.service_table import SERVICES

    env = child_env(drop=("DYNAMO_CONTROL_TOKEN",))
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        root = Path(tmp)
        model, n_params = _model(root, args.quick)
        proc, url = SERVICES["engine"].start(
            root / "engine.log", "--model", str(model), "engine.register_in_redis=false",
            env=env, cwd=REPO, timeout=300,
        )  # fmt: skip
        results = {}
        try:
            for variant in ("full", "lora"):
                out = root / f"{variant}.json"
                argv = [
                    sys.executable, str(Path(__file__).resolve()), "--worker",
                    "--variant", variant, "--model", str(model), "--url", url, "--out", str(out),
                    "--steps", str(args.steps), "--pushes", str(args.pushes),
                    "--batch", str(args.batch), "--seq", str(args.seq),
                ]  # fmt: skip
                run_logged(argv, root / f"{variant}.log", f"{variant}: the learner", env)
                results[variant] = json.loads(out.read_text())
        finally:
            proc.stop()
    full, lora = results["full"], results["lora"]
    print(f"model: {n_params / 1e6:.1f}M params (float32), one FSDP2 rank (gloo, CPU); "
          f"{args.steps} train steps of {args.batch}x{args.seq} tokens; best of "
          f"{max(1, args.pushes - 1)} pushes to an embedded engine; LoRA rank {RANK}, alpha "
          f"{ALPHA:g}, q/k/v/o")  # fmt: skip
    rows = [
        ("trainable parameters", "trainable", "{:,.0f}"),
        ("peak resident memory (MB)", "peak_mb", "{:,.0f}"),
        ("training's growth over loaded (MB)", "growth_mb", "{:,.0f}"),
        ("optimizer state (bytes)", "optimizer_bytes", "{:,.0f}"),
        ("push bytes", "push_bytes", "{:,.0f}"),
        ("push seconds", "push_s", "{:.4f}"),
        ("  of which gather (+ LoRA: write)", "push_gather_s", "{:.4f}"),
        ("train step seconds", "step_s", "{:.3f}"),
    ]
    for r in (full, lora):
        r["growth_mb"] = r["peak_mb"] - r["loaded_mb"]
    print(f"{'':<36} {'full':>16} {'lora':>16} {'lora/full':>10}")
    for label, key, fmt in rows:
        ratio = lora[key] / full[key] if full[key] else float("nan")
        print(f"{label:<36} {fmt.format(full[key]):>16} {fmt.format(lora[key]):>16} "
              f"{ratio:>10.4f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
