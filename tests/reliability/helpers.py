"""Shared bits of the reliability tests: the fuzzing budget, a grep for leaked secrets, and a
small ``dynamo-rl up`` run to inject faults into."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamo_rl import keys
from tests.conftest import REPO, dynamo_rl_argv

# Hypothesis examples per fuzzed operation: small in CI, larger by hand
# (DYNAMO_FUZZ_EXAMPLES=500 .venv/bin/python -m pytest tests/reliability).
FUZZ_EXAMPLES = int(os.environ.get("DYNAMO_FUZZ_EXAMPLES", "25"))

CONTROL_TOKEN = "ctl-9d4e1b7a5c3f-never-logged"


def assert_not_leaked(secret: str, *texts: str | Path) -> None:
    """``secret`` appears in none of ``texts`` (strings, or paths of files read as bytes)."""
    for text in texts:
        data = text.read_bytes() if isinstance(text, Path) else text.encode()
        assert secret.encode() not in data, f"control token leaked into {str(text)[:80]!r}"


# The quickstart shrunk to seconds per step: no warm start or evaluations, a one-layer model, small
# batches, and one batch of lead (the learner keeps pace with the workers, so faults land mid-run
# rather than after the workers have already produced everything).
SMALL_UP = (
    "up.warm_start.steps=0", "up.eval.prompts=0", "up.task_train=200", "up.task_test=20",
    "up.tiny_model.hidden_size=32", "up.tiny_model.num_layers=1", "rollout.batch_size=8",
    "rollout.n=4", "rollout.n_min=2", "rollout.n_max=8", "learner.train_batch_size=8",
    "rollout.max_pending_groups=8",
)  # fmt: skip


def send_signal(pids: Iterable[int], sig: int) -> None:
    """``sig`` to each of ``pids`` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@contextlib.contextmanager
def frozen(pids: Iterable[int]) -> Iterator[list[int]]:
    """``pids`` stopped (SIGSTOP) for the block and continued whatever happens in it: a failed
    assertion must not leave a process stopped (the teardown would then wait on it)."""
    stopped = list(pids)
    send_signal(stopped, signal.SIGSTOP)
    try:
        yield stopped
    finally:
        send_signal(stopped, signal.SIGCONT)


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (those that exit meanwhile are left out)."""
    out = [pid]
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return []
    for task in tasks:
        with contextlib.suppress(FileNotFoundError):
            for child in (task / "children").read_text().split():
                out += process_tree(int(child))
    return out


def _stream_id(eid: bytes | str) -> tuple[int, int]:
    text = eid.decode() if isinstance(eid, bytes) else eid
    ms, seq = text.split("-")
    return int(ms), int(seq)


def audit_stream(run_dir: Path, client: Any, namespace: str) -> list[str]:
    """Exactly once, from the learner's own durable record: every stream entry the learner's group
    read is listed by exactly one committed checkpoint of ``run_dir`` (``consumed`` in
    ``trainer_state.json``, all checkpoints kept: ``learner.checkpoint.keep``), nothing is pending
    and nothing was dead-lettered. Returns the committed ids in commit order."""
    committed: list[str] = []
    for folder in sorted((run_dir / "checkpoints").glob("step_*")):
        if (folder / "COMMITTED").exists():
            state = json.loads((folder / "trainer_state.json").read_text())
            committed += state["extra"]["consumed"]
    assert committed and len(committed) == len(set(committed)), "an entry was trained twice"
    stream, group = keys.trajectory_stream(namespace), keys.learner_group(namespace)
    info = {g["name"].decode(): g for g in client.xinfo_groups(stream)}[group]
    assert info["pending"] == 0
    last = _stream_id(info["last-delivered-id"])
    read = {eid.decode() for eid, _ in client.xrange(stream) if _stream_id(eid) <= last}
    assert set(committed) == read, "an entry the learner read was lost (or one never read trained)"
    assert client.xlen(keys.dead_letter_stream(namespace)) == 0
    return committed


class UpRun:
    """A small ``dynamo-rl up`` run as a child process, and what it writes.

    With ``redis_url`` it uses that Redis (the test can inspect it afterwards); without, ``up``
    embeds its own. ``config``: the shipped experiment (``configs/<config>.yaml``)."""

    def __init__(
        self,
        run_dir: Path,
        name: str,
        steps: int,
        *overrides: str,
        redis_url: str | None = None,
        config: str = "quickstart",
    ) -> None:
        self.run_dir = run_dir
        self.stdout = run_dir.parent / "up.out"
        argv = dynamo_rl_argv(
            "up", "--config", str(REPO / "configs" / f"{config}.yaml"), "--steps", str(steps),
            f"run.dir={run_dir}", f"run.name={name}", *SMALL_UP, *overrides,
        )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        if redis_url is not None:
            env["REDIS_URL"] = redis_url
        with open(self.stdout, "w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def output(self) -> str:
        return self.stdout.read_text()

    def records(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def pid(self, name: str) -> int:
        return int(json.loads((self.run_dir / "pids.json").read_text())[name])

    def progress(self) -> int:
        """Bytes written so far by ``up`` and its services (output, logs, step records)."""
        paths = [self.stdout, self.run_dir / "metrics.jsonl"]
        logs = self.run_dir / "logs"
        if logs.is_dir():
            paths += list(logs.iterdir())
        total = 0
        for path in paths:
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

    def wait(self, what: str, cond: Callable[[], bool], timeout: float = 240.0) -> None:
        """Until ``cond()``. Fails when ``up`` exits, when nothing of the run has written a byte
        for ``timeout`` s (stuck), or after ``5 * timeout`` s in all: on a loaded machine the
        start-up alone can take minutes (190 s seen at load 55 on 2 cores), so the deadline
        follows the run's progress rather than a fixed guess of its speed."""
        start = stalled_since = time.monotonic()
        seen = self.progress()
        while not cond():
            if self.proc.poll() is not None:
                pytest.fail(f"up exited ({self.proc.returncode}) waiting for {what}:\n"
                            f"{self.output()[-4000:]}")  # fmt: skip
            now, written = time.monotonic(), self.progress()
            if written != seen:
                seen, stalled_since = written, now
            if now - stalled_since > timeout:
                pytest.fail(f"timed out waiting for {what}: nothing written for {timeout:.0f} s:"
                            f"\n{self.output()[-4000:]}")  # fmt: skip
            if now - start > 5 * timeout:
                pytest.fail(f"timed out waiting for {what} ({5 * timeout:.0f} s in all):\n"
                            f"{self.output()[-4000:]}")  # fmt: skip
            time.sleep(0.3)

    def wait_steps(self, more: int) -> None:
        """Until ``more`` new step records appear (training went on)."""
        target = len(self.records()) + more
        self.wait(f"{more} more steps", lambda: len(self.records()) >= target)

    def log(self, name: str) -> str:
        """The log of service ``name`` so far ("" before it starts)."""
        path = self.run_dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @contextlib.contextmanager
    def supervisor_frozen(self) -> Iterator[None]:
        """``up`` itself stopped for the block: a service killed inside it stays down (no
        restart) until the test has seen the others notice, however long that takes."""
        with frozen([self.proc.pid]):
            yield

    def wait_restart(self, name: str, count: int = 1) -> None:
        self.wait(f"restart of {name}",
                  lambda: f"restarted {name} (pid" in self.output()
                  and self.output().count(f"restarted {name} ") >= count)  # fmt: skip

    def stop(self) -> None:
        """SIGTERM ``up`` if it still runs (it stops its children) and wait for it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


def kill_until_the_worker_meets_it(run: UpRun, service: str, line: str, what: str) -> None:
    """Kill ``service`` with ``up`` frozen until rollout worker 0 logs ``line`` once more (it met
    the outage: ``what``), then wait for ``up`` to restart it and for one more train step."""
    seen = run.log("rollout0").count(line)
    with run.supervisor_frozen():
        os.kill(run.pid(service), signal.SIGKILL)
        run.wait(what, lambda: run.log("rollout0").count(line) > seen)
    run.wait_restart(service)
    run.wait_steps(1)
