"""Tool calls under load: the ``code_interpreter`` environment's tool path against a real reward
service's ``/run_code`` (its bubblewrap sandbox).

    .venv/bin/python benchmarks/bench_tools.py [--quick] [--sandboxes 2] [--concurrency 1,2,4,8,16]

Each *episode* is a ``code_interpreter`` environment (``dynamo_rl.envs``) played by a scripted
model: ``--turns`` turns that each write one ```python cell, then a final answer. Its steps run
the real tool path — code-block parser, :class:`~dynamo_rl.envs.sandbox.SandboxClient` (one,
shared by every episode, as the rollout worker shares it), ``POST /run_code``, the sandbox, the
truncated observation — with ``C`` episodes at once (the worker's episodes of a batch run
concurrently). No engine is involved: the figures are the tool path's alone.

For each concurrency ``C``:

- episodes/s, tool calls/s, and each call's latency (``ToolCallRecord.latency_s``: the step's
  wall time of that call) p50 / p99;
- timeouts and errors (the tool errors the worker counts in
  ``dynamo_rollout_tool_errors_total``);
- the baseline: the same cells posted straight to ``/run_code`` by ``C`` bare httpx clients (no
  environment, no client retries, no parsing) -> the tool path's share of bare throughput;
- the scaling: tool calls/s against the sequential figure (``C = 1``).

A last round mixes in faulty cells at the top concurrency (1 in 8 raises, 1 in 16 loops past the
tool timeout): the timeouts and errors must be counted, none may escape as an exception, and the
clean cells' latency under that load is printed.

Nothing here asserts a time; the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import httpx  # noqa: E402
from _machine import write_result  # noqa: E402 - the result file, with its machine

from dynamo_rl.config.rollout import EnvConfig  # noqa: E402
from dynamo_rl.envs import EnvContext, make_env  # noqa: E402
from dynamo_rl.envs.sandbox import SandboxClient  # noqa: E402
from dynamo_rl.service_table import SERVICES  # noqa: E402

TOOL_TIMEOUT_S = 2.0


def cell(episode: int, turn: int, faulty: bool = False) -> str:
    """A cell's code: a product of two multi-digit numbers (what the agent recipe's model runs);
    with ``faulty``, 1 cell in 8 raises and 1 in 16 never ends."""
    k = episode * 3 + turn
    if faulty and k % 16 == 5:
        return "while True:\n    pass"
    if faulty and k % 8 == 3:
        return f"raise ValueError({k})"
    return f"print({1000 + k} * {2000 + 7 * k})"


def turn_text(code: str) -> str:
    return f"Let me compute it.\n```python\n{code}\n```"


@dataclass
class Round:
    label: str
    concurrency: int
    episodes: int = 0
    calls: int = 0
    wall_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    crashes: int = 0

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.wall_s if self.wall_s else 0.0

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s if self.wall_s else 0.0

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else 0.0


async def tool_path(
    url: str, concurrency: int, episodes: int, turns: int, faulty: bool = False
) -> Round:
    """``episodes`` code_interpreter episodes, ``concurrency`` at once, on one shared client."""
    cfg = EnvConfig(name="code_interpreter", tool_timeout_s=TOOL_TIMEOUT_S, max_turns=turns + 1)
    sandbox = SandboxClient(url, timeout_s=TOOL_TIMEOUT_S + 30.0, max_wait_s=30.0)
    out = Round("faulty" if faulty else "clean", concurrency)
    queue = list(range(episodes))

    async def one_episode(e: int) -> None:
        env = make_env(EnvContext(cfg, sandbox, seed=e))
        try:
            await env.reset({"prompt": "What is 1234 * 5678?"})
            for t in range(turns):
                step = await env.step(turn_text(cell(e, t, faulty)))
                for c in step.info.get("tool_calls", []):
                    out.calls += 1
                    if c.error:
                        kind = c.error.split(":")[0]
                        out.errors[kind] = out.errors.get(kind, 0) + 1
                    else:
                        out.latencies.append(c.latency_s)
            final = await env.step("The answer is 7006652.")
            assert final.done, "a turn without a code block ends the episode"
            out.episodes += 1
        except Exception as ex:  # a crash is a figure here, not a stop
            out.crashes += 1
            print(f"  episode {e} raised {type(ex).__name__}: {ex}", file=sys.stderr)
        finally:
            await env.aclose()

    async def lane() -> None:
        while queue:
            await one_episode(queue.pop())

    start = time.perf_counter()
    try:
        await asyncio.gather(*(lane() for _ in range(concurrency)))
    finally:
        await sandbox.aclose()
    out.wall_s = time.perf_counter() - start
    return out


async def bare(url: str, concurrency: int, episodes: int, turns: int) -> Round:
    """Baseline: the same clean cells posted straight to ``/run_code`` by ``concurrency``
    clients."""
    out = Round("bare", concurrency)
    queue = [cell(e, t) for e in range(episodes) for t in range(turns)]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:

        async def lane() -> None:
            while queue:
                body = {"code": queue.pop(), "language": "python", "run_timeout": TOOL_TIMEOUT_S}
                t = time.perf_counter()
                r = await client.post(f"{url}/run_code", json=body)
                out.calls += 1
                if r.status_code != 200 or r.json().get("status") != "Success":
                    out.errors[str(r.status_code)] = out.errors.get(str(r.status_code), 0) + 1
                else:
                    out.latencies.append(time.perf_counter() - t)

        start = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        out.wall_s = time.perf_counter() - start
    return out


def start_reward(workdir: Path, sandboxes: int):
    return SERVICES["reward"].start(
        workdir / "reward.log", "--math-workers", "1", "--sandbox-concurrency", str(sandboxes),
        "run.log_level=warning", cwd=ROOT, timeout=180,
    )  # fmt: skip


def errors_text(r: Round) -> str:
    if not r.errors:
        return "0 errors"
    return ", ".join(f"{n} {k}" for k, n in sorted(r.errors.items()))


def expected_faults(episodes: int, turns: int) -> dict[str, int]:
    """How many cells of the faulty mix were written to time out and to fail."""
    out = {"timeout": 0, "failed": 0}
    for e in range(episodes):
        for t in range(turns):
            code = cell(e, t, faulty=True)
            if code.startswith("while"):
                out["timeout"] += 1
            elif code.startswith("raise"):
                out["failed"] += 1
    return out


def figures(r: Round) -> dict[str, object]:
    return {
        "concurrency": r.concurrency,
        "episodes": r.episodes,
        "tool_calls": r.calls,
        "wall_s": round(r.wall_s, 3),
        "episodes_per_s": round(r.episodes_per_s, 3),
        "tool_calls_per_s": round(r.calls_per_s, 2),
        "p50_ms": round(r.pct(0.5), 1),
        "p99_ms": round(r.pct(0.99), 1),
        "errors": dict(r.errors),
        "crashes": r.crashes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: 2 concurrencies")
    parser.add_argument("--sandboxes", type=int, default=2, help="reward service sandboxes")
    parser.add_argument("--concurrency", default=None, help="episodes at once, e.g. 1,2,4,8,16")
    parser.add_argument("--episodes", type=int, default=None, help="episodes per concurrency")
    parser.add_argument("--turns", type=int, default=3, help="code cells per episode")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    q = args.quick
    levels = [int(c) for c in (args.concurrency or ("1,4" if q else "1,2,4,8,16")).split(",")]
    episodes = args.episodes or (8 if q else 32)
    turns = args.turns
    load_start = os.getloadavg()[0]
    print(
        f"tool benchmark ({'quick' if q else 'full'}): code_interpreter episodes of {turns} "
        f"cells against /run_code, {args.sandboxes} sandboxes, {episodes} episodes per "
        f"concurrency; load average {load_start:.1f} on {os.cpu_count()} CPUs"
    )
    rounds: list[dict[str, object]] = []
    report: dict[str, object] = {"sandboxes": args.sandboxes, "episodes": episodes,
                                 "turns": turns, "load_start": load_start, "rounds": rounds}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_reward(Path(tmp), args.sandboxes)
        try:
            asyncio.run(bare(url, 2, 2, 2))  # warm up the service and the sandbox
            sequential = None
            for c in levels:
                base = asyncio.run(bare(url, c, episodes, turns))
                r = asyncio.run(tool_path(url, c, episodes, turns))
                sequential = sequential or r.calls_per_s
                print(
                    f"C={c:>3}: {r.episodes_per_s:6.2f} episodes/s, {r.calls_per_s:6.1f} tool "
                    f"calls/s, latency p50 {r.pct(0.5):5.0f} ms p99 {r.pct(0.99):5.0f} ms, "
                    f"{errors_text(r)}, {r.crashes} crashed | bare /run_code "
                    f"{base.calls_per_s:6.1f} calls/s (p50 {base.pct(0.5):.0f} ms, "
                    f"{errors_text(base)}) -> tool path {r.calls_per_s / base.calls_per_s:.2f}x "
                    f"bare, {r.calls_per_s / sequential:.2f}x sequential"
                )
                rounds.append(
                    {
                        "tool_path": figures(r),
                        "bare": figures(base),
                        "ratio_to_bare": r.calls_per_s / base.calls_per_s,
                        "ratio_to_sequential": r.calls_per_s / sequential,
                    }
                )
            top = levels[-1]
            f = asyncio.run(tool_path(url, top, episodes, turns, faulty=True))
            want = expected_faults(episodes, turns)
            print(
                f"faulty mix, C={top}: {f.calls_per_s:.1f} tool calls/s, {f.episodes_per_s:.2f} "
                f"episodes/s; {errors_text(f)} (cells written to time out: {want['timeout']}, "
                f"to fail: {want['failed']}); {f.crashes} crashed; clean cells' latency p50 "
                f"{f.pct(0.5):.0f} ms p99 {f.pct(0.99):.0f} ms (tool timeout {TOOL_TIMEOUT_S:g}s)"
            )
            report["faulty"] = {**figures(f), "expected": want}
        finally:
            proc.stop()
    report["load_end"] = os.getloadavg()[0]
    print(f"load average at the end {report['load_end']:.1f}")
    if args.json is not None:
        write_result(args.json, report, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
