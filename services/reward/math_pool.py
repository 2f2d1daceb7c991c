"""A pool of math-verify worker processes, fed batches, with a hard per-item timeout of our own.

math-verify's timeouts use ``signal.alarm``, which only works on a process's main thread (off it,
math-verify raises or quietly scores 0), and sympy can hang or explode on hostile input. So each
worker is a separate process (spawned, not forked: the service runs threads) that scores items on
its main thread with math-verify's own timeouts off, under an address-space limit.

Items are queued (:meth:`MathPool.submit`, :meth:`MathPool.submit_many`) and each worker has a
feeder thread in the parent that takes up to ``batch_size`` queued items at once (an even share of
the queue, so a burst spreads over every worker) and sends them in one message; the worker answers
item by item as it goes. The parent waits at most ``timeout_s`` for each answer. A worker that is
late or dead is killed and replaced: the item it was on scores 0 with reason ``timeout`` — never
1 — and the items of the batch it had not reached go back to the front of the queue, so every
item is answered. If a worker cannot be replaced and none is left, every waiting and later item
scores 0 with reason ``timeout`` and a detail that says so.

What a worker runs is its *runner*: a top-level function the worker calls once, on its main
thread, that imports what it needs and returns the function scoring one job (a tuple) to a result
dict. :func:`math_runner` (math-verify, the default) is one; the ``reasoning_gym`` kind's pool runs
``services.reward.rg_answer.runner`` (the library's ``score_answer``) the same way.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import multiprocessing as mp
import threading
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

_CTX = mp.get_context("spawn")

Job = tuple[Any, ...]  # math: (response, ground truth, extraction mode)
Runner = Callable[[], Callable[[Job], dict[str, Any]]]
"""A top-level function (spawned workers import it by name): called once in the worker, returns
the function that scores one job."""


def math_runner() -> Callable[[Job], dict[str, Any]]:
    """math-verify: jobs are ``(response, ground_truth, mode)``."""
    import logging as _logging

    # math-verify warns once per process that its timeouts are off: they are, on purpose.
    _logging.getLogger("math_verify").setLevel(_logging.ERROR)
    from services.reward.math_answer import score_math

    score_math("\\boxed{1}", "1", "last_boxed")  # warm the imports and parser caches

    def score(job: Job) -> dict[str, Any]:
        return score_math(*job)

    return score


def _worker_main(conn: Connection, memory_mb: int, runner: Runner, what: str) -> None:
    """Worker process: for each batch of jobs received, send one result per job, in order, as
    each is scored; stop when the pipe closes."""
    import resource
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    if memory_mb > 0:
        limit = memory_mb << 20
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        score = runner()
    except Exception as e:  # e.g. the library is not installed: the parent says why
        conn.send(f"failed: {type(e).__name__}: {str(e)[:500]}")
        return
    conn.send("ready")
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        for job in batch:
            try:
                result = score(job)
            except MemoryError:
                result = {
                    "correct": False,
                    "format_ok": True,
                    "reason": "wrong_answer",
                    "detail": f"{what} ran out of memory on this answer",
                }
            except Exception as e:  # math-verify/sympy failures are the answer's problem
                result = {
                    "correct": False,
                    "format_ok": True,
                    "reason": "wrong_answer",
                    "detail": f"{what} failed: {type(e).__name__}: {str(e)[:200]}",
                }
            conn.send(result)


def _timeout(detail: str) -> dict[str, Any]:
    return {"correct": False, "format_ok": False, "reason": "timeout", "detail": detail}


class _Worker:
    def __init__(
        self, memory_mb: int, start_timeout_s: float, runner: Runner, what: str, name: str
    ) -> None:
        self.conn, child = _CTX.Pipe()
        self.proc = _CTX.Process(
            target=_worker_main, args=(child, memory_mb, runner, what), daemon=True
        )
        self.proc.start()
        child.close()
        try:
            greeting = self.conn.recv() if self.conn.poll(start_timeout_s) else None
        except (EOFError, OSError):  # the runner failed: the worker exited before "ready"
            self.kill()
            raise RuntimeError(
                f"{name} worker exited while starting (exit code {self.proc.exitcode}; see the "
                "service log)"
            ) from None
        if greeting is None:
            self.kill()
            raise RuntimeError(f"{name} worker did not start within {start_timeout_s:.0f}s")
        if greeting != "ready":
            self.kill()
            if isinstance(greeting, str) and greeting.startswith("failed: "):
                raise RuntimeError(f"{name} worker could not start: {greeting[8:]}")
            raise RuntimeError(f"{name} worker sent an unexpected greeting")

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.join(timeout=5)
        with contextlib.suppress(Exception):
            self.conn.close()


class MathPool:
    """``workers`` processes running ``runner`` (math-verify by default), fed batches of at most
    ``batch_size`` items; ``timeout_s`` per item. ``name`` names the workers in errors, ``what``
    the code that scores in an item's detail when it fails."""

    def __init__(
        self,
        workers: int,
        timeout_s: float,
        memory_mb: int = 4096,
        start_timeout_s: float = 120.0,
        batch_size: int = 64,
        runner: Runner = math_runner,
        what: str = "math-verify",
        name: str = "math",
    ) -> None:
        self.runner, self.what, self.name = runner, what, name
        self.size = workers
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.start_timeout_s = start_timeout_s
        self.batch_size = batch_size
        self.restarts = 0  # read by the metrics collector
        self.batches = 0  # worker calls made (one message, up to batch_size items)
        self._queue: collections.deque[tuple[Job, Future[dict[str, Any]]]] = collections.deque()
        self._cond = threading.Condition()
        self._all: set[_Worker] = set()
        self._feeders: list[threading.Thread] = []
        self._live = 0  # feeders with a worker
        self._closed = False

    def start(self) -> None:
        """Start every worker (in parallel), wait until each has run its runner (imported
        math-verify), then start their feeders."""
        errors: list[BaseException] = []
        started: list[_Worker] = []

        def one() -> None:
            try:
                started.append(self._new_worker())
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with self._cond:
            self._all.update(started)
        if errors:
            self.close()
            raise RuntimeError(f"{self.name} worker pool failed to start: {errors[0]}")
        with self._cond:
            self._live = len(started)
        for i, worker in enumerate(started):
            t = threading.Thread(target=self._feed, args=(worker,), name=f"{self.name}-feed-{i}")
            t.daemon = True
            t.start()
            self._feeders.append(t)

    def _new_worker(self) -> _Worker:
        return _Worker(self.memory_mb, self.start_timeout_s, self.runner, self.what, self.name)

    def submit_many(self, jobs: list[Job]) -> list[Future[dict[str, Any]]]:
        """Queue items; each future resolves to the item's result dict (never to an error)."""
        futures: list[Future[dict[str, Any]]] = [Future() for _ in jobs]
        with self._cond:
            if self._closed or self._live == 0:
                for f in futures:
                    f.set_result(_timeout(self._unavailable()))
                return futures
            self._queue.extend(zip(jobs, futures, strict=True))
            self._cond.notify(min(len(jobs), self._live))
        return futures

    def submit(self, response: str, ground_truth: str, mode: str) -> Future[dict[str, Any]]:
        return self.submit_many([(response, ground_truth, mode)])[0]

    def score(self, response: str, ground_truth: str, mode: str) -> dict[str, Any]:
        """Score one item; blocks until a worker answers or the timeout passes."""
        return self.submit(response, ground_truth, mode).result()

    def _unavailable(self) -> str:
        if self._closed:
            return f"the {self.name} worker pool is shut down"
        return f"no {self.name} worker is running (replacing one failed; see the service log)"

    def _take(self) -> list[tuple[Job, Future[dict[str, Any]]]]:
        """Block for queued items; an even share of the queue, at most ``batch_size``."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return []
            n = min(self.batch_size, max(1, math.ceil(len(self._queue) / max(1, self._live))))
            self.batches += 1
            return [self._queue.popleft() for _ in range(min(n, len(self._queue)))]

    def _feed(self, worker: _Worker) -> None:
        while True:
            batch = self._take()
            if not batch:
                return
            next_worker = self._run(worker, batch)
            if next_worker is None:
                return
            worker = next_worker

    def _run(
        self, worker: _Worker, batch: list[tuple[Job, Future[dict[str, Any]]]]
    ) -> _Worker | None:
        """Send ``batch`` to ``worker`` and resolve its futures; returns the worker to go on
        with (a replacement when this one failed), or None when the feeder must stop."""
        done = 0
        try:
            worker.conn.send([job for job, _ in batch])
            while done < len(batch):
                if not worker.conn.poll(self.timeout_s):
                    detail = f"no answer within {self.timeout_s:g}s; worker replaced"
                    break
                batch[done][1].set_result(worker.conn.recv())
                done += 1
            else:
                return worker
        except (EOFError, OSError) as e:
            detail = f"worker died ({type(e).__name__}); worker replaced"
        worker.kill()
        with self._cond:
            self._all.discard(worker)
            self.restarts += 1
        batch[done][1].set_result(_timeout(detail))
        rest = batch[done + 1 :]
        with self._cond:
            if not self._closed:
                self._queue.extendleft(reversed(rest))  # the rest, in order, first
                self._cond.notify(len(rest))
                rest = []
        for _, future in rest:  # the pool was shut down meanwhile
            future.set_result(_timeout(self._unavailable()))
        return self._respawn()

    def _respawn(self) -> _Worker | None:
        """A replacement worker, or None (the feeder stops) when the pool is closed or the
        replacement fails; the last feeder to stop fails what is still queued."""
        fresh = None
        if not self._closed:
            try:
                fresh = self._new_worker()
            except Exception:
                log.exception(
                    "could not replace a %s worker; the pool is one worker short", self.name
                )
        orphans: list[tuple[Job, Future[dict[str, Any]]]] = []
        with self._cond:
            if fresh is not None and not self._closed:
                self._all.add(fresh)
                return fresh
            self._live -= 1
            if self._live == 0:
                orphans = list(self._queue)
                self._queue.clear()
        if fresh is not None:
            fresh.kill()
        for _, future in orphans:
            future.set_result(_timeout(self._unavailable()))
        return None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for _, future in pending:
            future.set_result(_timeout(self._unavailable()))
        for w in workers:
            w.kill()
