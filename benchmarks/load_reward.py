"""Load test of the reward service: many concurrent clients against one real server process.

    .venv/bin/python benchmarks/load_reward.py [--clients 200] [--duration 30] [--kind math]
        [--items 1] [--server KEY=VALUE ...]

Starts ``dynamo-rl reward`` on a free loopback port (its default config unless ``--server``
overrides are given), then ``--clients`` asyncio clients each POST ``/v1/verify`` back to back
for ``--duration`` seconds (``--items`` items per request; ``math`` items are distinct answers,
``code`` items a small sandboxed Python program with one stdio case). It prints requests/s,
p50/p99 latency of the successful requests, outcomes by type (HTTP status or exception class),
the server's peak RSS (main process, and with its math workers and sandboxes), and whether the
service answers ``/healthz`` and scores an item correctly afterwards. Only 429 and 503 are
acceptable errors under overload; the exit status is 1 otherwise or when it is unhealthy.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks._load import RssSampler, Tally, deadline, report  # noqa: E402
from dynamo_rl.service_table import SERVICES  # noqa: E402


def make_item(kind: str, k: int) -> dict:
    if kind == "code":
        return {"id": str(k), "kind": "code", "response": "```python\nprint(int(input()) * 2)\n```",
                "tests": {"type": "stdio", "cases": [{"stdin": str(k), "stdout": str(2 * k)}]}}  # fmt: skip
    return {"id": str(k), "kind": "math", "response": f"so \\boxed{{{k}/4}}",
            "ground_truth": str(k / 4)}  # fmt: skip


async def client(url: str, args: argparse.Namespace, i: int, end: float, tally: Tally) -> None:
    async with httpx.AsyncClient(timeout=args.timeout) as http:
        k = i * 1_000_000
        while time.monotonic() < end:
            items = [make_item(args.kind, k + j) for j in range(args.items)]
            k += args.items
            t0 = time.monotonic()
            try:
                r = await http.post(f"{url}/v1/verify", json={"items": items})
                outcome = str(r.status_code)
                ok = r.status_code == 200 and len(r.json()["results"]) == args.items
                if r.status_code == 429:
                    # Back off as the contract says (Retry-After), but never past the deadline.
                    wait = float(r.headers.get("retry-after", "1"))
                    await asyncio.sleep(min(wait, max(0.0, end - time.monotonic())))
            except httpx.HTTPError as e:
                outcome, ok = type(e).__name__, False
            tally.add(outcome, time.monotonic() - t0, ok)


async def drive(url: str, args: argparse.Namespace) -> tuple[Tally, float]:
    tally = Tally()
    start = time.monotonic()
    end = deadline(args.duration)
    await asyncio.gather(*(client(url, args, i, end, tally) for i in range(args.clients)))
    return tally, time.monotonic() - start


def healthy(url: str) -> bool:
    try:
        if httpx.get(f"{url}/healthz", timeout=10).json().get("status") != "ok":
            return False
        item = {"id": "h", "kind": "math", "response": "\\boxed{2}", "ground_truth": "2"}
        r = httpx.post(f"{url}/v1/verify", json={"items": [item]}, timeout=60)
        return r.status_code == 200 and r.json()["results"][0]["correct"] is True
    except httpx.HTTPError:
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    p.add_argument("--kind", choices=["math", "code"], default="math")
    p.add_argument("--items", type=int, default=1, help="items per request")
    p.add_argument("--timeout", type=float, default=60.0, help="client timeout per request (s)")
    p.add_argument("--server", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides for the server, e.g. reward.math.max_pending=64")  # fmt: skip
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = SERVICES["reward"].start(
            Path(tmp) / "reward.log", "--host", "127.0.0.1", *args.server, cwd=ROOT, timeout=120
        )
        try:
            with RssSampler(proc.pid) as rss:
                tally, wall = asyncio.run(drive(url, args))
                ok = healthy(url) and proc.alive()
            title = f"reward /v1/verify ({args.items} {args.kind} item(s) per request)"
            return report(title, tally, wall, args.clients, rss, {"429", "503"}, "200", ok)
        finally:
            proc.stop()


if __name__ == "__main__":
    sys.exit(main())
