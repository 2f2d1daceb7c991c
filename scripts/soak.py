"""Soak flaky-prone tests: run each N times in a row beside busy CPU loops, and log every run.

Every run is one ``pytest`` process; its result (pass/fail, exit code, duration, the 1-minute load
average at its end) is appended as one JSON line to ``<out>/soak.jsonl`` and the output of a
failed run is kept in ``<out>/fail-<n>.log``. A failure does not stop the soak: the next run
starts. ``--until HH:MM`` (UTC) stops it in time — a run that would pass that moment is killed and
logged as ``cut``, and no further run starts. The busy loops are started in their own sessions
and killed at the end (also on SIGINT/SIGTERM).

    python scripts/soak.py \\
        tests/reliability/test_faults_redis.py::test_redis_restart_keeps_stream_stats_and_pending_entries:30 \\
        tests/reliability/test_faults_up.py:10 tests/reliability/test_faults_engines.py:10 \\
        --busy 2 --out runs/soak --until 12:55
    python scripts/soak.py --summary runs/soak/soak.jsonl   # runs, passes, duration range per test
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUSY = "while True: pass"


def _parse_spec(spec: str) -> tuple[str, int]:
    test, sep, count = spec.rpartition(":")
    if not sep or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(
            f"test spec {spec!r}: expected TEST:RUNS with RUNS a positive integer "
            "(e.g. tests/reliability/test_faults_up.py:10)"
        )
    return test, int(count)


def _deadline(text: str | None) -> float | None:
    """Seconds since the epoch of today's HH:MM UTC (None: no deadline)."""
    if text is None:
        return None
    try:
        hh, mm = (int(x) for x in text.split(":"))
        now = dt.datetime.now(dt.UTC)
        at = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--until {text!r}: expected HH:MM (UTC)") from e
    return at.timestamp()


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def summary(path: Path) -> dict[str, dict]:
    """Per test: runs, passes, failures, cut runs, duration range and total (seconds)."""
    out: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        s = out.setdefault(
            r["test"], {"runs": 0, "passed": 0, "failed": 0, "cut": 0, "durations": [], "load": []}
        )
        s["runs"] += 1
        s[r["result"]] += 1
        if r["result"] != "cut":
            s["durations"].append(r["duration_s"])
        s["load"].append(r["load1"])
    for s in out.values():
        d, load = s.pop("durations"), s.pop("load")
        s["duration_s"] = [min(d), max(d)] if d else None
        s["total_s"] = round(sum(d), 1)
        s["load1"] = [min(load), max(load)] if load else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "tests",
        nargs="*",
        type=_parse_spec,
        metavar="TEST:RUNS",
        help="a pytest node id or file, and how many runs in a row",
    )
    p.add_argument("--busy", type=int, default=2, help="busy CPU loops beside the runs (default 2)")
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "runs" / "soak",
        help="folder for soak.jsonl and failed runs' output (default runs/soak)",
    )
    p.add_argument(
        "--until",
        type=_deadline,
        default=None,
        metavar="HH:MM",
        help="UTC time after which no run starts and a running one is cut",
    )
    p.add_argument(
        "--summary",
        type=Path,
        default=None,
        metavar="JSONL",
        help="print the per-test summary of a soak log and exit",
    )
    args = p.parse_args(argv)
    if args.summary is not None:
        print(json.dumps(summary(args.summary), indent=1))
        return 0
    if not args.tests:
        p.error("give at least one TEST:RUNS (or --summary JSONL)")
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "soak.jsonl"
    busy = [
        subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
        for _ in range(args.busy)
    ]
    current: list[subprocess.Popen] = []

    def stop(signum, frame):
        for proc in current + busy:
            _kill_group(proc)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    n = sum(1 for _ in log.open()) if log.exists() else 0
    failures = 0
    started = time.monotonic()
    try:
        for test, runs in args.tests:
            for i in range(1, runs + 1):
                if args.until is not None and time.time() >= args.until:
                    print(f"--until reached: {test} stopped before run {i}", flush=True)
                    break
                n += 1
                out_path = args.out / f"run-{n}.log"
                with out_path.open("wb") as f:
                    t0, at = time.monotonic(), dt.datetime.now(dt.UTC)
                    proc = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "pytest",
                            "-x",
                            "-q",
                            "-p",
                            "no:cacheprovider",
                            test,
                        ],
                        cwd=ROOT,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                    current[:] = [proc]
                    left = None if args.until is None else max(1.0, args.until - time.time())
                    try:
                        rc = proc.wait(timeout=left)
                        result = "passed" if rc == 0 else "failed"
                    except subprocess.TimeoutExpired:
                        _kill_group(proc)
                        rc, result = None, "cut"
                    current.clear()
                duration = round(time.monotonic() - t0, 1)
                if result == "failed":
                    failures += 1
                    out_path.rename(args.out / f"fail-{n}.log")
                else:
                    out_path.unlink()
                record = {
                    "n": n,
                    "test": test,
                    "run": i,
                    "result": result,
                    "rc": rc,
                    "duration_s": duration,
                    "start": at.isoformat(timespec="seconds"),
                    "load1": round(os.getloadavg()[0], 2),
                }
                with log.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)
                if result == "cut":
                    break
    finally:
        for proc in busy:
            _kill_group(proc)
    print(f"soak: {failures} failed; {time.monotonic() - started:.0f} s in all", flush=True)
    print(json.dumps(summary(log), indent=1), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
