"""Load test of the allocator: many concurrent gRPC clients against one real server process.

    .venv/bin/python benchmarks/load_allocator.py [--clients 200] [--duration 30]
        [--prompts 64] [--namespace-size 20000] [--server KEY=VALUE ...]

Starts a Redis-protocol server and ``dynamo-rl allocator`` on free loopback ports, fills a
namespace with statistics for ``--namespace-size`` prompts, then ``--clients`` asyncio gRPC
clients (one channel each, as separate rollout workers would have) alternate ``Allocate`` of
``--prompts`` random prompt ids and ``ReportOutcomes`` of the same prompts, back to back, for
``--duration`` seconds. It prints calls/s, p50/p99 latency of the successful calls, outcomes by
status code, the allocator's peak RSS, and whether its health service (``dynamo.v1.Allocator``)
is SERVING and an ``Allocate`` answers afterwards. Only RESOURCE_EXHAUSTED and UNAVAILABLE are
acceptable errors under overload; the exit status is 1 otherwise or when it is unhealthy.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from benchmarks._load import RssSampler, Tally, deadline, report  # noqa: E402
from dynamo_rl.procs import grpc_healthy, start_redis  # noqa: E402
from dynamo_rl.proto.dynamo.v1 import allocator_pb2 as pb  # noqa: E402
from dynamo_rl.proto.dynamo.v1 import allocator_pb2_grpc as pb_grpc  # noqa: E402
from dynamo_rl.service_table import SERVICES  # noqa: E402

SERVICE = "dynamo.v1.Allocator"
NS = "load"


async def client(addr: str, args: argparse.Namespace, i: int, end: float, tally: Tally) -> None:
    rng = random.Random(i)
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        while time.monotonic() < end:
            ids = [f"p{j}" for j in rng.sample(range(args.namespace_size), args.prompts)]
            for method in ("Allocate", "ReportOutcomes"):
                if method == "Allocate":
                    call = stub.Allocate(pb.AllocateRequest(namespace=NS, prompt_ids=ids,
                                                            n_per_prompt=16), timeout=args.timeout)  # fmt: skip
                else:
                    outcomes = [pb.Outcome(prompt_id=p, attempts=16, successes=rng.randint(0, 16))
                                for p in ids]  # fmt: skip
                    call = stub.ReportOutcomes(
                        pb.ReportOutcomesRequest(namespace=NS, outcomes=outcomes),
                        timeout=args.timeout,
                    )
                t0 = time.monotonic()
                try:
                    await call
                    tally.add(f"{method}:OK", time.monotonic() - t0, True)
                    tally.add("OK", 0.0, False)
                except grpc.aio.AioRpcError as e:
                    tally.add(e.code().name, time.monotonic() - t0, False)
                    if e.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                    ):
                        await asyncio.sleep(0.1)


async def drive(addr: str, args: argparse.Namespace) -> tuple[Tally, float]:
    tally = Tally()
    start = time.monotonic()
    end = deadline(args.duration)
    await asyncio.gather(*(client(addr, args, i, end, tally) for i in range(args.clients)))
    return tally, time.monotonic() - start


def prefill(addr: str, size: int) -> None:
    with grpc.insecure_channel(addr) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        rng = random.Random(0)
        for lo in range(0, size, 4096):
            outcomes = [pb.Outcome(prompt_id=f"p{j}", attempts=16, successes=rng.randint(0, 16))
                        for j in range(lo, min(size, lo + 4096))]  # fmt: skip
            stub.ReportOutcomes(
                pb.ReportOutcomesRequest(namespace=NS, outcomes=outcomes), timeout=30
            )


def healthy(addr: str) -> bool:
    try:
        with grpc.insecure_channel(addr) as channel:
            status = (
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10)
                .status
            )
            reply = pb_grpc.AllocatorStub(channel).Allocate(
                pb.AllocateRequest(namespace=NS, prompt_ids=["p1", "p2"], n_per_prompt=8),
                timeout=10,
            )
        return status == health_pb2.HealthCheckResponse.SERVING and sum(reply.counts) == 16
    except grpc.RpcError:
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    p.add_argument("--prompts", type=int, default=64, help="prompt ids per call")
    p.add_argument("--namespace-size", type=int, default=20000)
    p.add_argument("--timeout", type=float, default=30.0, help="deadline per call (s)")
    p.add_argument("--server", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides for the allocator, e.g. allocator.decay=0.9")  # fmt: skip
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis_proc, redis_url = start_redis(Path(tmp) / "redis")
        proc, addr = SERVICES["allocator"].start(
            Path(tmp) / "allocator.log", "--redis-url", redis_url, *args.server, cwd=ROOT
        )
        try:
            proc.wait_ready(grpc_healthy(addr, SERVICE), timeout=60)
            prefill(addr, args.namespace_size)
            with RssSampler(proc.pid) as rss:
                tally, wall = asyncio.run(drive(addr, args))
                ok = healthy(addr) and proc.alive()
            # Per-call figures: "OK" counts every successful call; latencies are of those calls.
            by_method = {k: v for k, v in tally.outcomes.items() if ":" in k}
            for k in by_method:
                del tally.outcomes[k]
            print(f"successful by method: {by_method}")
            title = f"allocator Allocate + ReportOutcomes ({args.prompts} prompts per call, " \
                    f"namespace of {args.namespace_size})"  # fmt: skip
            allowed = {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}
            return report(title, tally, wall, args.clients, rss, allowed, "OK", ok)
        finally:
            proc.stop()
            redis_proc.stop()


if __name__ == "__main__":
    sys.exit(main())
