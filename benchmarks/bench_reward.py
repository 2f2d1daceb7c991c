"""Reward service figures, measured against a real ``dynamo-rl reward`` process.

    .venv/bin/python benchmarks/bench_reward.py [--quick]

1. Math items/s through /v1/verify with 2 math workers, side by side in one run: the service as
   configured by default (fast path, batching, de-duplication) against the same service with
   them off (``reward.math.fast_path=false reward.math.dedup=false reward.math.batch_size=1``:
   one worker round trip per item, as before they existed) and against math-verify called in
   this process on one thread. Three mixes: numeric answers (4 clients, 256 items a request;
   target >= 3x in-process math-verify), distinct symbolic answers, and rollout-shaped symbolic
   answers (groups of 16 samples of a prompt with 3 distinct answers; target >= 5x the
   per-item service).
2. Code runs/s of a trivial Python program through the sandbox (/run_code, 2 sandboxes, 2 clients).
3. Sandbox start-up overhead: one sandboxed ``python3 -c pass`` (bwrap + prlimit + uid drop, this
   process calling :class:`services.reward.sandbox.Sandbox` directly) against a bare
   ``python3 -c pass`` subprocess; medians of interleaved runs. Target: ≤ 2.5×.
4. /v1/verify latency under 32 concurrent clients (one math item per request): p50 and p99.

Every figure is printed with its ratio to its baseline or target; nothing here asserts a time.
Closing note: the threat model's covered / not covered lists (from services/reward/sandbox.py).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from dynamo_rl.procs import ServiceProcess  # noqa: E402
from dynamo_rl.service_table import SERVICES  # noqa: E402
from services.reward.sandbox import RunLimits, Sandbox  # noqa: E402


def math_answer(k: int, symbolic: bool = False) -> tuple[str, str]:
    """A (response, ground truth) pair; ``k`` makes every answer distinct, so math-verify's
    parse caches cannot flatter the figure.

    The numeric mix is what GSM8K/MATH-style rollouts mostly produce (one in eight wrong, one in
    eight without an answer); the symbolic mix (polynomials, intervals, sets, radicals) is where
    sympy's simplification costs 0.1-0.6 s an item.
    """
    kind = k % 8
    if symbolic:
        if kind % 4 == 0:
            return rf"\boxed{{x^2+{2 * k}x+{k * k}}}", f"(x+{k})^2"
        if kind % 4 == 1:
            return rf"\boxed{{[{k}, {k + 1})}}", f"[{k},{k + 1})"
        if kind % 4 == 2:
            return rf"\boxed{{\{{{k}, {k + 2}\}}}}", rf"\{{{k + 2},{k}\}}"
        return rf"\boxed{{\sqrt{{{4 * k}}}}}", rf"2\sqrt{{{k}}}"
    if kind == 0:
        return rf"The answer is \boxed{{\frac{{{k}}}{{2}}}}.", str(k / 2)
    if kind == 1:
        return rf"So the total is \boxed{{{k}}}.", str(k)
    if kind == 2:
        return f"Adding up, we get {k} apples.\nAnswer: {k}", str(k)
    if kind == 3:
        return rf"\boxed{{{k + 1}}}", str(k)
    if kind == 4:
        return rf"\boxed{{{k}.25}}", f"{k}.25"
    if kind == 5:
        return rf"\boxed{{{k}\%}}", str(k / 100)
    if kind == 6:
        return rf"\boxed{{\$ {k}}}", str(k)
    return "I am not sure.", str(k)


def start_server(workdir: Path, *overrides: str) -> tuple[ServiceProcess, str]:
    return SERVICES["reward"].start(
        workdir / "reward.log", "--math-workers", "2", "--sandbox-concurrency", "2",
        "run.log_level=warning", *overrides, cwd=ROOT, timeout=180,
    )  # fmt: skip


PER_ITEM = ("reward.math.fast_path=false", "reward.math.dedup=false", "reward.math.batch_size=1")
"""The math path before batching, the fast path and de-duplication: one item per worker call."""


def math_items(n: int, offset: int = 0, symbolic: bool = False) -> list[dict[str, object]]:
    items = []
    for k in range(offset, offset + n):
        response, truth = math_answer(k, symbolic)
        items.append({"id": k, "kind": "math", "response": response, "ground_truth": truth})
    return items


def rollout_items(n: int, offset: int = 0) -> list[dict[str, object]]:
    """Symbolic items shaped like one RL step: groups of 16 samples of one prompt whose final
    answers take 3 values (right, a common mistake, another), in different surrounding text."""
    items = []
    for i in range(n):
        g, s = divmod(offset + i, 16)
        right, truth = math_answer(g, symbolic=True)
        pick = (s * 7) % 16
        answer = right if pick < 9 else (rf"\boxed{{{g}}}" if pick < 14 else r"\boxed{0}")
        items.append({"id": offset + i, "kind": "math", "ground_truth": truth,
                      "response": f"Sample {s}: after some work, {answer}"})  # fmt: skip
    return items


def bench_math_in_process(items: list[dict[str, object]]) -> float:
    """Baseline: math-verify called directly, one thread, on the same items."""
    import logging

    from services.reward.math_answer import score_math

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    score_math(r"\boxed{1}", "1", "last_boxed")
    start = time.perf_counter()
    for item in items:
        score_math(str(item["response"]), str(item["ground_truth"]), "last_boxed")
    return len(items) / (time.perf_counter() - start)


def bench_math(url: str, items: list[dict[str, object]], per_request: int, clients: int) -> float:
    """Items/s of ``items`` posted by ``clients`` concurrent clients, ``per_request`` a request."""
    chunks = [items[i : i + per_request] for i in range(0, len(items), per_request)]

    async def run() -> float:
        limits = httpx.Limits(max_connections=clients)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            warm = await client.post(f"{url}/v1/verify", json={"items": math_items(8, 10**6)})
            warm.raise_for_status()
            queue = list(reversed(chunks))

            async def one() -> None:
                while queue:
                    r = await client.post(f"{url}/v1/verify", json={"items": queue.pop()})
                    r.raise_for_status()

            start = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(clients)))
            return len(items) / (time.perf_counter() - start)

    return asyncio.run(run())


def path_counts(url: str) -> dict[str, float]:
    """The service's math items so far by path (fast, dedup, worker), from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = re.findall(
        r'^dynamo_reward_math_items_by_path_total\{path="(\w+)"\} (\S+)$', text, re.M
    )
    return {path: float(v) for path, v in found}


def _shares(counts: dict[str, float]) -> str:
    total = sum(counts.values()) or 1.0
    return "items by path: " + ", ".join(f"{p} {100 * n / total:.0f}%" for p, n in counts.items())


def math_side_by_side(workdir: Path, q: bool) -> None:
    """Every math figure of one run: both services up at once, the mixes measured in turn."""
    numeric = math_items(1024 if q else 4096)
    symbolic = math_items(64 if q else 128, 0, symbolic=True)
    rollout = rollout_items(256 if q else 512)
    for sub in ("fast", "per_item"):
        (workdir / sub).mkdir(exist_ok=True)
    fast, fast_url = start_server(workdir / "fast")
    slow, slow_url = start_server(workdir / "per_item", *PER_ITEM)
    try:
        rates, paths = {}, {}
        for name, items, per_request, clients in (
            ("numeric", numeric, 256, 4),
            ("symbolic", symbolic, 32, 2),
            ("rollout", rollout, 256, 2),
        ):
            before = path_counts(fast_url)
            rates[name] = (
                bench_math(fast_url, items, per_request, clients),
                bench_math(slow_url, items, per_request, clients),
            )
            after = path_counts(fast_url)
            paths[name] = {
                p: after.get(p, 0) - before.get(p, 0) for p in ("fast", "dedup", "worker")
            }
    finally:
        fast.stop()
        slow.stop()
    in_numeric = bench_math_in_process(numeric[:512])
    in_symbolic = bench_math_in_process(symbolic)
    new, old = rates["numeric"]
    print(
        f"math numeric mix (4 clients x 256 items): {new:.0f} items/s with 2 workers; per-item "
        f"service {old:.0f}/s; in-process math-verify {in_numeric:.0f}/s -> {new / in_numeric:.2f}x "
        f"in-process (target >= 3x: {'met' if new / in_numeric >= 3 else 'NOT met'}), "
        f"{new / old:.2f}x per-item; {_shares(paths['numeric'])}"
    )
    for name, label in (("symbolic", "distinct symbolic"), ("rollout", "rollout-shaped symbolic")):
        new, old = rates[name]
        print(
            f"math {label} mix: {new:.1f} items/s with 2 workers; per-item service {old:.1f}/s "
            f"-> {new / old:.2f}x (target >= 5x: {'met' if new / old >= 5 else 'NOT met'}); "
            f"in-process math-verify on distinct symbolic items {in_symbolic:.1f}/s -> "
            f"{new / in_symbolic:.2f}x; {_shares(paths[name])}"
        )


async def _code_client(url: str, runs: int, client: httpx.AsyncClient) -> None:
    body = {"code": "print(sum(range(10)))", "language": "python"}
    for _ in range(runs):
        r = await client.post(f"{url}/run_code", json=body)
        r.raise_for_status()
        assert r.json()["run_result"]["stdout"] == "45\n", r.text


async def bench_code(url: str, total: int) -> float:
    async with httpx.AsyncClient(timeout=120) as client:
        await _code_client(url, 2, client)  # warm up
        start = time.perf_counter()
        await asyncio.gather(*(_code_client(url, total // 2, client) for _ in range(2)))
        return (total // 2 * 2) / (time.perf_counter() - start)


def bench_startup(repeats: int) -> tuple[float, float]:
    sandbox = Sandbox()
    sandbox.check()
    argv = ["/usr/bin/python3", "-c", "pass"]
    limits = RunLimits(timeout_s=10)
    bare, boxed = [], []
    for _ in range(repeats):  # interleaved so load changes hit both alike
        t = time.perf_counter()
        subprocess.run(argv, check=True)
        bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        result = sandbox.run(argv, limits)
        boxed.append(time.perf_counter() - t)
        assert result.ok, result
    return statistics.median(bare) * 1e3, statistics.median(boxed) * 1e3


async def bench_latency(url: str, clients: int, per_client: int) -> tuple[float, float, float]:
    latencies: list[float] = []

    async def one_client(c: int, client: httpx.AsyncClient) -> None:
        for i in range(per_client):
            item = math_items(1, 10**5 + c * 1000 + i)
            t = time.perf_counter()
            r = await client.post(f"{url}/v1/verify", json={"items": item})
            latencies.append(time.perf_counter() - t)
            r.raise_for_status()

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(one_client(c, client) for c in range(clients)))
        wall = time.perf_counter() - start
    latencies.sort()
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return p50 * 1e3, p99 * 1e3, len(latencies) / wall


def threat_model() -> tuple[str, str]:
    doc = (ROOT / "services" / "reward" / "sandbox.py").read_text()
    covered = doc.split("Covered (")[1].split("\n", 1)[1].split("\n\nNot covered")[0]
    not_covered = doc.split("Not covered — say so plainly\n")[1].split('"""')[0]
    return covered.rstrip(), not_covered.rstrip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--math-only", action="store_true", help="only the math figures")
    args = parser.parse_args()
    q = args.quick
    print(f"reward benchmark ({'quick' if q else 'full'}); 2 math workers, 2 sandboxes")
    if args.math_only:
        with tempfile.TemporaryDirectory() as tmp:
            math_side_by_side(Path(tmp), q)
        return 0

    bare_ms, boxed_ms = bench_startup(15 if q else 40)
    ratio = boxed_ms / bare_ms
    print(
        f"sandbox start-up: sandboxed python3 -c pass {boxed_ms:.1f} ms vs bare {bare_ms:.1f} ms "
        f"-> {ratio:.2f}x (target <= 2.5x: {'met' if ratio <= 2.5 else 'NOT met'})"
    )

    with tempfile.TemporaryDirectory() as tmp:
        math_side_by_side(Path(tmp), q)
        proc, url = start_server(Path(tmp))
        try:
            runs = asyncio.run(bench_code(url, 40 if q else 160))
            print(
                f"code: {runs:.1f} sandboxed runs/s of a trivial Python program "
                f"(2 sandboxes; {1000 * 2 / runs:.0f} ms per run per slot)"
            )
            p50, p99, rps = asyncio.run(bench_latency(url, 32, 4 if q else 12))
            print(
                f"/v1/verify under 32 concurrent clients (1 math item each): p50 {p50:.0f} ms, "
                f"p99 {p99:.0f} ms, {rps:.0f} requests/s; p99/p50 = {p99 / p50:.2f}"
            )
        finally:
            proc.stop()

    covered, not_covered = threat_model()
    print("\nThreat model (services/reward/sandbox.py)\nCovered:")
    print(covered)
    print("Not covered:")
    print(not_covered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
