"""Weight-push time from the learner to an inference engine, against a memcpy of the same bytes.

A ~100M-parameter model (the tiny Qwen2 config scaled up: hidden 768, 12 layers; ``--quick``:
hidden 256, 4 layers, ~4M) is sharded by FSDP2 over ``--ranks`` learner ranks (``torchrun``,
gloo, CPU) and pushed ``--pushes`` times per run by the learner's real ``DistributedPush`` to:

- ``embedded``: a ``dynamo-rl engine`` through the vLLM-shaped protocol — flat buckets
  (``dynamo_rl/contracts/weight_layout.py``, ``--bucket-mb``);
- ``embedded-per-tensor``: the same engine through the SGLang-shaped protocol — one broadcast
  per tensor (SGLang's contract; what every push did before the flat buckets);
- ``vllm``: a real vLLM server (CPU build from ``.venv-vllm``, the project's plugin's gloo
  backend, flat buckets).

Each push is split into gather (all-gathering FSDP shards, every rank), transfer (rank 0:
packing and the broadcasts until every engine has the bytes), answer (the engines' update
answers and finish calls) and pause→resume (vLLM-shaped: from the pause to the resume answer).
The first push of a run forms the groups and is left out; each run reports its best push.
The baseline is ``torch.Tensor.copy_`` of the same number of bytes in this process (best of 5);
the ratio is push throughput / memcpy throughput (the target of the flat buckets: >= 0.15).

    .venv/bin/python benchmarks/bench_push.py [--targets embedded,embedded-per-tensor,vllm]
        [--runs 3] [--pushes 3] [--ranks 2] [--bucket-mb 256] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from _learner_bench import child_env, memcpy_gbps, run_logged  # noqa: E402

TARGETS = ("embedded", "embedded-per-tensor", "vllm")
API = {"embedded": "vllm", "embedded-per-tensor": "sglang", "vllm": "vllm"}


def _env() -> dict[str, str]:
    return child_env(drop=("DYNAMO_CONTROL_TOKEN",))


# ---- the learner side: run under torchrun ------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    import torch

    from dynamo_rl.contracts.weight_control import weight_protocol
    from learner.dist import init_distributed
    from learner.model import load_policy, shard
    from learner.push import DistributedPush

    env = init_distributed(timeout_s=600.0)
    model = shard(load_policy(args.model), env.device, torch.float32)
    push = DistributedPush(
        master_address="127.0.0.1", bucket_mb=args.bucket_mb, timeout_s=300.0,
        device=env.device, protocol=weight_protocol(args.api),
    )  # fmt: skip
    records = []
    try:
        for version in range(1, args.pushes + 1):
            r = push.push(model, version, [args.url])
            records.append({
                "ok": r.ok, "error": r.error, "bytes": r.bytes, "seconds": r.seconds,
                "gather": r.gather_seconds, "transfer": r.send_seconds,
                "answer": r.answer_seconds, "paused": r.paused_seconds,
            })  # fmt: skip
    finally:
        push.close()
    if env.is_main:
        Path(args.out).write_text(json.dumps(records))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


# ---- the driver ---------------------------------------------------------------------------------


def _model(root: Path, quick: bool) -> tuple[Path, int]:
    from learner.tiny_model import build_tiny_model

    shape = (
        {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2}
        if quick
        else {"hidden_size": 768, "num_layers": 12, "num_heads": 12}
    )
    path = build_tiny_model(root / ("model-quick" if quick else "model-100m"), **shape)
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        n = 0
        for key in f.keys():  # noqa: SIM118
            size = 1
            for d in f.get_slice(key).get_shape():
                size *= d
            n += size
    return path, n


def _start_engine(target: str, model: Path, root: Path, redis_url: str) -> tuple[object, str]:
    if target == "vllm":
        from dynamo_rl.procs import ServiceProcess, free_port, http_ok
        from tests.vllm.conftest import VLLM_PYTHON, vllm_argv, vllm_env

        if not VLLM_PYTHON.exists():
            raise SystemExit(f"{VLLM_PYTHON} is missing: run `bash scripts/setup.sh --vllm`")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = ServiceProcess("vllm", vllm_argv(model, port, "raw_logprobs"),
                              root / "vllm.log", env=vllm_env(root), cwd=root)  # fmt: skip
        proc.start()
        try:
            proc.wait_ready(http_ok(f"{url}/health"), timeout=900)
        except BaseException:
            proc.stop()
            raise
        return proc, url
    from dynamo_rl.service_table import SERVICES

    return SERVICES["engine"].start(
        root / f"engine-{target}.log", "--model", str(model), f"endpoints.redis_url={redis_url}",
        f"run.name=bench-push-{target}", env=_env(), cwd=REPO, timeout=300,
    )  # fmt: skip


def _run(target: str, model: Path, url: str, root: Path, k: int, args: argparse.Namespace):
    out = root / f"{target}-{k}.json"
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={args.ranks}", str(Path(__file__).resolve()), "--worker",
        "--model", str(model), "--url", url, "--api", API[target], "--out", str(out),
        "--pushes", str(args.pushes), "--bucket-mb", str(args.bucket_mb),
    ]  # fmt: skip
    run_logged(argv, root / f"{target}-{k}.log", f"{target}: the learner", _env())
    records = json.loads(out.read_text())
    bad = [r["error"] for r in records if not r["ok"]]
    if bad:
        raise SystemExit(f"{target}: a push failed: {bad}")
    return min(records[1:] or records, key=lambda r: r["seconds"])


def _span(values: list[float], fmt: str = "{:.3f}") -> str:
    lo, hi = min(values), max(values)
    med = statistics.median(values)
    return f"{fmt.format(med)} [{fmt.format(lo)}-{fmt.format(hi)}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="embedded,embedded-per-tensor,vllm")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pushes", type=int, default=3, help="per run; the first forms the group")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=256.0, help="learner.push.bucket_mb")
    ap.add_argument("--quick", action="store_true", help="a ~4M-parameter model")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--api", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        ap.error(f"--targets: unknown {unknown}; allowed: {', '.join(TARGETS)}")
    from dynamo_rl.procs import start_redis

    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        root = Path(tmp)
        redis, redis_url = start_redis(root / "redis")  # engines register their version there
        try:
            return _bench(root, redis_url, targets, args)
        finally:
            redis.stop()


def _bench(root: Path, redis_url: str, targets: list[str], args: argparse.Namespace) -> int:
    model, n_params = _model(root, args.quick)
    print(f"model: {n_params / 1e6:.1f}M params (float32), {args.ranks} learner ranks "
          f"(FSDP2, gloo, CPU), {args.runs} runs x {args.pushes} pushes, "
          f"bucket_mb {args.bucket_mb:g}; per run its best push after the first")  # fmt: skip
    for target in targets:
        proc, url = _start_engine(target, model, root, redis_url)
        try:
            best = [_run(target, model, url, root, k, args) for k in range(args.runs)]
        finally:
            proc.stop()  # type: ignore[attr-defined]
        nbytes = best[0]["bytes"]
        memcpy = memcpy_gbps(nbytes)
        ratios = [r["bytes"] / r["seconds"] / 1e9 / memcpy for r in best]
        print(f"\n{target} ({API[target]}-shaped{', flat buckets' if API[target] == 'vllm' else ', per tensor'}): "
              f"{nbytes / 1e6:.0f} MB per push; median [min-max] over {len(best)} runs")  # fmt: skip
        print(f"  push {'':<13} {_span([r['seconds'] for r in best])} s")
        for key in ("gather", "transfer", "answer", "paused"):
            label = "pause->resume" if key == "paused" else key
            print(f"    {label:<14} {_span([r[key] for r in best])} s")
        print(f"  memcpy of the same bytes: {nbytes / memcpy / 1e9:.3f} s ({memcpy:.2f} GB/s)")
        print(f"  ratio push / memcpy: {_span(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
