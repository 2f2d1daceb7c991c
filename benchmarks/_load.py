"""What both load generators share: the latency/error tally and a peak-RSS sampler.

Load goes to 127.0.0.1 only; every generator is bounded by a client count and a duration and
stops by itself.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*") if Path(f"/proc/{p}").exists() else []:
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return out


class RssSampler:
    """Samples the resident memory of a process (and of its whole tree) every ``interval`` s."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_main_kib = 0
        self.peak_tree_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak_main_kib = max(self.peak_main_kib, _rss_kib(self.pid))
            tree = sum(_rss_kib(p) for p in _descendants(self.pid))
            self.peak_tree_kib = max(self.peak_tree_kib, tree)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Tally:
    """Latencies of successful calls and outcomes by kind (``200``, ``429``, ``ReadTimeout``...)."""

    latencies_s: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: str, latency_s: float, ok: bool) -> None:
        self.outcomes[outcome] += 1
        if ok:
            self.latencies_s.append(latency_s)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def report(
    title: str,
    tally: Tally,
    wall_s: float,
    clients: int,
    rss: RssSampler,
    allowed: set[str],
    ok_outcome: str,
    healthy: bool,
) -> int:
    """Print the figures; return 0 when only allowed outcomes occurred and the service is healthy."""
    total = sum(tally.outcomes.values())
    ok = tally.outcomes[ok_outcome]
    bad = {k: v for k, v in tally.outcomes.items() if k != ok_outcome and k not in allowed}
    print(f"== {title}: {clients} concurrent clients for {wall_s:.1f} s (loopback)")
    print(
        f"requests        {total} ({total / wall_s:.1f}/s), successful {ok} ({ok / wall_s:.1f}/s)"
    )
    print(
        f"latency (ok)    p50 {1000 * percentile(tally.latencies_s, 0.5):.1f} ms, "
        f"p99 {1000 * percentile(tally.latencies_s, 0.99):.1f} ms, "
        f"max {1000 * max(tally.latencies_s, default=float('nan')):.1f} ms"
    )
    print(f"outcomes        {dict(sorted(tally.outcomes.items()))}")
    print(f"allowed errors  {sorted(allowed)}; disallowed: {bad or 'none'}")
    print(
        f"peak RSS        server {rss.peak_main_kib / 1024:.1f} MiB, "
        f"server + children {rss.peak_tree_kib / 1024:.1f} MiB"
    )
    print(f"healthy after   {'yes' if healthy else 'NO'}")
    return 0 if healthy and not bad else 1


def deadline(duration_s: float) -> float:
    return time.monotonic() + duration_s
