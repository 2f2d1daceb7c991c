"""Concurrent gRPC clients for ``bench_allocator.py``, and the bare server it compares against.

- :func:`run_clients` starts ``clients`` separate processes (as separate rollout workers would
  be), each with one :class:`~dynamo_rl.clients.allocator.AllocatorClient`, which all begin at
  one instant and call ``Allocate`` or ``ReportOutcomes`` back to back (closed loop: one call in
  flight per client, so never more than ``clients`` on the server) for ``duration_s``; it returns
  every call's latency and each client's CPU time.
- ``python benchmarks/_grpc_load.py echo PORT_FILE`` serves ``dynamo.v1.Allocator`` the way the
  allocator does (the same server kind and options) but does no work: it reads no request and
  answers each call with a reply of the real shape and size, built once (the "bare gRPC echo").
  It is the ceiling of this machine's gRPC stack for these messages: the allocator can at best
  match it.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAMESPACE_SIZE = 20_000
BATCH = 512


def dataset() -> list[str]:
    return [f"prompt-{i}" for i in range(NAMESPACE_SIZE)]


def batch(worker: int, call: int) -> list[str]:
    """A batch of 512 distinct prompt ids of the dataset, different per worker and call."""
    start = (worker * 4099 + call * 512) % (NAMESPACE_SIZE - BATCH)
    return [f"prompt-{i}" for i in range(start, start + BATCH)]


@dataclass
class ClientResult:
    latencies_s: list[float]
    cpu_s: float
    errors: int
    calls: int
    """Successful calls, the 20 warm-up calls included."""
    first_error: str = ""


def _client(
    addr: str, method: str, worker: int, duration_s: float, ready: Any, go: Any, queue: mp.Queue
) -> None:
    from dynamo_rl.clients.allocator import AllocatorClient

    # Requests built ahead: the client's own work per call is the gRPC call (and the reply).
    batches = [batch(worker, c) for c in range(8)]
    reports = [[(pid, 16, (i * 7 + worker) % 17) for i, pid in enumerate(b)] for b in batches]
    latencies: list[float] = []
    errors = 0
    first_error = ""
    with AllocatorClient(addr, timeout_s=10.0, retries=0) as client:

        def one(c: int) -> None:
            if method == "Allocate":
                client.allocate("bench", batches[c % 8], 16, n_min=8, n_max=24)
            else:
                client.report_outcomes("bench-report", reports[c % 8])

        for c in range(20):  # warm the channel and the server's code paths
            one(c)
        ready.release()
        go.wait()
        end = time.monotonic() + duration_s
        cpu0 = time.process_time()
        c = 0
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                one(c)
            except Exception as e:  # counted and shown; the run goes on
                errors += 1
                first_error = first_error or f"{type(e).__name__}: {e}"[:300]
                c += 1
                continue
            latencies.append(time.perf_counter() - t0)
            c += 1
        cpu = time.process_time() - cpu0
    queue.put(ClientResult(latencies, cpu, errors, len(latencies) + 20, first_error))


def run_clients(addr: str, method: str, clients: int, duration_s: float) -> list[ClientResult]:
    """``clients`` processes calling ``method`` back to back for ``duration_s`` from one instant."""
    ctx = mp.get_context("spawn")  # grpc does not survive fork
    queue: mp.Queue = ctx.Queue()
    ready, go = ctx.Semaphore(0), ctx.Event()
    procs = [
        ctx.Process(target=_client, args=(addr, method, w, duration_s, ready, go, queue))
        for w in range(clients)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:  # every client started and warmed up: then all begin at once
            if not ready.acquire(timeout=120):
                raise TimeoutError(f"{method} clients: not all {clients} warmed up within 120 s")
        go.set()
        results = [queue.get(timeout=120 + duration_s) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return results


def _canned_replies() -> dict[str, bytes]:
    """Replies of the real shape and size: 512 counts and priorities; 512 prompts updated."""
    from dynamo_rl.proto.dynamo.v1 import allocator_pb2 as pb

    counts = [16 + (i % 9) - 4 for i in range(BATCH)]
    priorities = [0.01 + (i % 23) / 100 for i in range(BATCH)]
    return {
        "Allocate": pb.AllocateResponse(
            counts=counts, priorities=priorities, budget=sum(counts)
        ).SerializeToString(),
        "ReportOutcomes": pb.ReportOutcomesResponse(
            ok=True, prompts_updated=BATCH
        ).SerializeToString(),
    }


def serve_echo(port_file: Path) -> None:
    """Serve the canned replies on a free loopback port, written to ``port_file``; the server is
    built as the allocator's (``grpc.aio``, the same options)."""
    import asyncio

    import grpc

    from allocator.server import MAX_MESSAGE_BYTES, SERVICE_NAME

    replies = _canned_replies()

    def handler(reply: bytes) -> grpc.RpcMethodHandler:
        async def handle(raw: bytes, context: Any) -> bytes:
            return reply

        return grpc.unary_unary_rpc_method_handler(handle)

    async def main() -> None:
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ]
        )
        handlers = {method: handler(reply) for method, reply in replies.items()}
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_file.write_text(str(port))
        await server.wait_for_termination()

    asyncio.run(main())


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "echo":
        sys.exit(f"usage: {sys.argv[0]} echo PORT_FILE")
    serve_echo(Path(sys.argv[2]))
