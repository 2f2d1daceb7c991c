"""A pool of math-verify worker processes with a hard per-item timeout of our own.

math-verify's timeouts use ``signal.alarm``, which only works on a process's main thread (off it,
math-verify raises or quietly scores 0), and sympy can hang or explode on hostile input. So each
worker is a separate process (spawned, not forked: the service runs threads) that scores one item
at a time on its main thread with math-verify's own timeouts off, under an address-space limit.
The parent waits at most ``timeout_s`` for the answer; a worker that is late or dead is killed and
replaced, and the item scores 0 with reason ``timeout`` — never 1.

:meth:`MathPool.score` blocks; call it from at most ``workers`` threads at once (the scorer holds a
semaphore of that size), so a free worker is always there to take it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import queue
import threading
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

_CTX = mp.get_context("spawn")


def _worker_main(conn: Connection, memory_mb: int) -> None:
    """Worker process: answer ``(response, ground_truth, mode)`` requests until the pipe closes."""
    import resource
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    if memory_mb > 0:
        limit = memory_mb << 20
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import logging as _logging

    # math-verify warns once per process that its timeouts are off: they are, on purpose.
    _logging.getLogger("math_verify").setLevel(_logging.ERROR)
    from services.reward.math_answer import score_math

    score_math("\\boxed{1}", "1", "last_boxed")  # warm the imports and parser caches
    conn.send("ready")
    while True:
        try:
            response, ground_truth, mode = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result = score_math(response, ground_truth, mode)
        except MemoryError:
            result = {
                "correct": False,
                "format_ok": True,
                "reason": "wrong_answer",
                "detail": "math-verify ran out of memory on this answer",
            }
        except Exception as e:  # math-verify/sympy failures are the answer's problem
            result = {
                "correct": False,
                "format_ok": True,
                "reason": "wrong_answer",
                "detail": f"math-verify failed: {type(e).__name__}: {str(e)[:200]}",
            }
        conn.send(result)


class _Worker:
    def __init__(self, memory_mb: int, start_timeout_s: float) -> None:
        self.conn, child = _CTX.Pipe()
        self.proc = _CTX.Process(target=_worker_main, args=(child, memory_mb), daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(start_timeout_s):
            self.kill()
            raise RuntimeError(f"math worker did not start within {start_timeout_s:.0f}s")
        if self.conn.recv() != "ready":
            self.kill()
            raise RuntimeError("math worker sent an unexpected greeting")

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.join(timeout=5)
        with contextlib.suppress(Exception):
            self.conn.close()


class MathPool:
    """``workers`` math-verify processes; :meth:`score` enforces ``timeout_s`` per item."""

    def __init__(
        self, workers: int, timeout_s: float, memory_mb: int = 4096, start_timeout_s: float = 120.0
    ) -> None:
        self.size = workers
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.start_timeout_s = start_timeout_s
        self.restarts = 0  # read by the metrics collector
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Start every worker (in parallel) and wait until each has imported math-verify."""
        errors: list[BaseException] = []

        def one() -> None:
            try:
                self._add(_Worker(self.memory_mb, self.start_timeout_s))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.close()
            raise RuntimeError(f"math worker pool failed to start: {errors[0]}")

    def _add(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                worker.kill()
                return
            self._all.add(worker)
        self._idle.put(worker)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)
            self.restarts += 1
        try:
            self._add(_Worker(self.memory_mb, self.start_timeout_s))
        except Exception:
            # Leave the slot empty rather than fail the item again; log so an operator sees it.
            log.exception("could not replace a math worker; the pool is one worker short")

    def score(self, response: str, ground_truth: str, mode: str) -> dict[str, Any]:
        """Score one item; blocks until a worker answers or the timeout passes."""
        worker = self._idle.get(timeout=self.start_timeout_s + self.timeout_s)
        try:
            worker.conn.send((response, ground_truth, mode))
            if worker.conn.poll(self.timeout_s):
                result = worker.conn.recv()
                self._idle.put(worker)
                return result
            detail = f"no answer within {self.timeout_s:g}s; worker replaced"
        except (EOFError, OSError, BrokenPipeError) as e:
            detail = f"worker died ({type(e).__name__}); worker replaced"
        self._replace(worker)
        return {"correct": False, "format_ok": False, "reason": "timeout", "detail": detail}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
        for w in workers:
            w.kill()
