"""Rank 0's links with the inference engines during a distributed weight push
(:class:`learner.push.DistributedPush`): one two-rank group per engine, and every HTTP call of the
engine-control contract (:mod:`dynamo_rl.contracts.engine`) around the broadcasts.

Each engine is handled on threads of its own (:class:`Job`) so that one that dies or hangs fails
alone: a version read that does not answer leaves the engine out of the push at once, a group whose
``init_group`` call fails is given up without waiting for the group's timeout, and a broadcast
abandoned mid-transfer is released on a thread (:func:`release_when_done`), never by the caller.
While a push is under way every engine in it is watched (:class:`Heartbeat`, ``GET /health``): one
that stops answering (stopped with SIGSTOP, a hung host) is left out within
``learner.push.stopped_s`` plus a beat or two when its pulse in Redis stands still too (else
``learner.push.silent_s``: busy, not stopped), wherever the push is, rather than at
``push.timeout_s``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from dynamo_rl.contracts.weight_control import (
    Call,
    WeightControlError,
    WeightProtocol,
    read_version,
    send,
)
from dynamo_rl.procs import free_port

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0
"""Deadline of one short control call: a heartbeat's ``GET /health``, a ``recover``, a version read
outside a push. The version read that opens a push waits ``learner.push.silent_s`` instead."""
WATCH_S = 0.25
"""How often a wait on an engine's broadcasts looks at that engine's HTTP call."""
BEAT_S = 1.0
"""How often a :class:`Heartbeat` asks its engine."""
LIVENESS = Call("GET", "/health")
"""The heartbeat's call: answered by the serving process itself (vLLM: without a round trip to its
engine core, busy receiving the weights), so it answers during an update too."""


class Job:
    """One function on a thread of its own: its result or its error, waited on with a timeout."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error = ""
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(fn,), daemon=True).start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except WeightControlError as e:  # names the engine and the route already
            self.error = str(e)
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(max(0.0, timeout))

    @property
    def done(self) -> bool:
        return self._done.is_set()


class Heartbeat:
    """``GET /health`` to one engine every :data:`BEAT_S` on a thread of its own, while a push is
    under way, and a read of the engine's pulse in Redis as often (``pulse()``: its counter, None
    when it has none; :class:`dynamo_rl.contracts.engine.EnginePulse`). :attr:`silent` once the
    engine has not answered for ``silent_s`` (``learner.push.silent_s``: busy or not), or for
    ``stopped_s`` (``learner.push.stopped_s``: stopped, not busy) while the last
    ``stopped_s / BEAT_S`` reads of its pulse all found it unchanged. Counting reads rather than
    seconds keeps a stall of the learner's own threads from passing for a stopped engine. An
    engine whose pulse is unknown is judged by ``silent_s`` alone."""

    def __init__(
        self,
        url: str,
        protocol: WeightProtocol,
        headers: dict[str, str],
        silent_s: float,
        stopped_s: float | None = None,
        pulse: Callable[[], int | None] | None = None,
    ) -> None:
        self.url = url
        self.silent_s = silent_s
        self.stopped_s = silent_s if stopped_s is None else stopped_s
        self.still_reads_needed = max(1, math.ceil(self.stopped_s / BEAT_S))
        self.answered = time.monotonic()
        self.pulse_value: int | None = None  # the last counter read; None: no pulse known
        self.still_reads = 0  # reads in a row that found the counter unchanged
        self._stop = threading.Event()
        ask = functools.partial(send, protocol, url, LIVENESS, headers=headers,
                                timeout_s=PROBE_TIMEOUT_S)  # fmt: skip
        threading.Thread(target=self._run, args=(ask,), daemon=True, name=f"beat-{url}").start()
        if pulse is not None:
            threading.Thread(target=self._watch_pulse, args=(pulse,), daemon=True,
                             name=f"pulse-{url}").start()  # fmt: skip

    def _run(self, ask: Callable[[], Any]) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # silence is what counts, not the answer
                ask()
                self.answered = time.monotonic()
            self._stop.wait(BEAT_S)

    def _watch_pulse(self, pulse: Callable[[], int | None]) -> None:
        while not self._stop.is_set():
            try:
                value = pulse()
            except Exception:  # Redis unreachable: the pulse tells nothing
                value = None
            still = value is not None and value == self.pulse_value
            self.still_reads = self.still_reads + 1 if still else 0
            self.pulse_value = value
            self._stop.wait(BEAT_S)

    @property
    def silent(self) -> bool:
        quiet = time.monotonic() - self.answered
        stopped = self.pulse_value is not None and self.still_reads >= self.still_reads_needed
        return quiet > self.silent_s or (quiet > self.stopped_s and stopped)

    def stop(self) -> None:
        self._stop.set()


SILENT = (
    "stopped answering (no answer to GET /health for learner.push.silent_s, or for "
    "learner.push.stopped_s with its pulse in Redis standing still)"
)


def wait_job(job: Job, until: float, beat: Heartbeat | None) -> bool:
    """Wait for ``job`` until the monotonic time ``until``, or until ``beat`` falls silent;
    whether it finished."""
    while not job.wait(min(WATCH_S, until - time.monotonic())):
        if time.monotonic() >= until or (beat is not None and beat.silent):
            return job.done
    return True


@dataclass
class Link:
    """Rank 0's push group with one engine (the learner is rank 0, the engine rank 1)."""

    url: str
    name: str
    group: Any
    store: Any
    version: int | None = None  # what the engine reported after this link's last push


class EngineFailed(Exception):
    pass


def wait_works(
    works: list[Any], watch: Job | None, deadline: float, beat: Heartbeat | None = None
) -> None:
    """Wait on one engine's broadcasts; :class:`EngineFailed` as soon as one fails, the engine's
    ``update`` call has failed, the engine stopped answering (``beat``), or the deadline passed."""
    for work in works:
        while True:
            try:
                work.wait(datetime.timedelta(seconds=WATCH_S))
                break
            except RuntimeError as e:
                if "timed out" not in str(e).lower():
                    raise EngineFailed(f"broadcast failed: {e}") from None
            if watch is not None and watch.done and watch.error:
                raise EngineFailed(watch.error)
            if beat is not None and beat.silent:
                raise EngineFailed(SILENT)
            if time.monotonic() > deadline:
                raise EngineFailed("broadcast not received within learner.push.timeout_s")


def release_when_done(link: Link, works: list[Any]) -> None:
    """Keep an abandoned group alive until its broadcasts end (a dead peer fails them at once, a
    hung one at the group's timeout): destroying a gloo group joins its worker threads, which
    would block the caller."""

    def wait() -> None:
        for work in works:
            with contextlib.suppress(Exception):
                work.wait()
        with contextlib.suppress(Exception):
            link.group.shutdown()

    threading.Thread(target=wait, daemon=True, name=f"release-{link.name}").start()


def describe(failed: dict[str, str]) -> str:
    return "; ".join(f"{u}: {e}" for u, e in failed.items()) or "no engines"


@dataclass(kw_only=True, eq=False)
class EngineLinks:
    """The groups rank 0 holds, keyed by engine URL, and the calls that open and close a push."""

    protocol: WeightProtocol
    headers: dict[str, str]
    master_address: str
    timeout_s: float
    backend: str
    flat_bytes: int  # the receiver's bucket size; 0: one tensor per broadcast
    group_prefix: str
    silent_s: float  # learner.push.silent_s: see Heartbeat
    stopped_s: float | None = None  # learner.push.stopped_s: see Heartbeat (None: silent_s)
    pulse: Callable[[str], int | None] | None = None  # an engine's pulse counter in Redis
    links: dict[str, Link] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)  # engines sent before_update in this push
    beats: dict[str, Heartbeat] = field(default_factory=dict)  # engines in this push, watched

    def send(self, url: str, calls: Sequence[Call], timeout_s: float | None = None) -> None:
        for call in calls:
            send(self.protocol, url, call, headers=self.headers,
                 timeout_s=self.timeout_s if timeout_s is None else timeout_s)  # fmt: skip

    def start(self, url: str, calls: Sequence[Call]) -> Job:
        """``calls`` to ``url`` on a thread of their own."""
        return Job(functools.partial(self.send, url, calls))

    def forget(self, url: str) -> None:
        """Forget a link whose broadcasts are in flight (released by :func:`release_when_done`)."""
        self.links.pop(url, None)

    def drop(self, url: str) -> None:
        """Forget an idle link (no broadcast in flight: those go through release_when_done)."""
        link = self.links.pop(url, None)
        if link is not None and link.group is not None:
            with contextlib.suppress(Exception):
                link.group.shutdown()

    def _form(self, url: str) -> tuple[Link, Job, Job]:
        """Start forming a group with ``url``: (its link once formed, the init call, the
        group's construction)."""
        port = free_port()
        name = self.protocol.group_name or f"{self.group_prefix}-{uuid.uuid4().hex[:12]}"
        timeout = datetime.timedelta(seconds=self.timeout_s)
        store = dist.TCPStore(
            "0.0.0.0", port, 2, is_master=True, timeout=timeout, wait_for_workers=False
        )
        call = self.protocol.init_group(
            master_address=self.master_address, master_port=port, rank_offset=1, world_size=2,
            group_name=name, backend=self.backend, bucket_bytes=self.flat_bytes,
            timeout_s=self.timeout_s,
        )  # fmt: skip
        init = self.start(url, [call])

        def build() -> Any:
            prefixed = dist.PrefixStore(name, store)
            if self.backend == "nccl":
                return dist.ProcessGroupNCCL(prefixed, 0, 2)
            return dist.ProcessGroupGloo(prefixed, 0, 2, timeout)

        return Link(url, name, None, store), init, Job(build)

    def prepare(self, engines: Sequence[str], failed: dict[str, str]) -> list[Link]:
        """Probe, (re)form groups, pause: the links that take part in this push."""
        self.end_push()  # the beats of a push that ended in an error, if any
        for url in [u for u in self.links if u not in engines]:
            self.drop(url)
        # An engine too busy to answer soon is not a stopped one: the opening read waits as long
        # as the heartbeat would (a vLLM CPU server sampling for 16 clients took up to 7 s), and
        # the heartbeat watches it from here on.
        probe_s = min(self.silent_s, self.timeout_s)
        self.beats = {u: self._beat(u) for u in engines}
        probes = {
            u: Job(functools.partial(read_version, self.protocol, u, headers=self.headers,
                                     timeout_s=probe_s))
            for u in engines
        }  # fmt: skip
        until = time.monotonic() + probe_s + 5
        for url, probe in probes.items():
            wait_job(probe, until, self.beats[url])
            link = self.links.get(url)
            if not probe.done or probe.error:
                reason = SILENT if self.beats[url].silent and not probe.done else "no answer"
                failed[url] = f"unreachable: {probe.error or reason}"
                self.beats.pop(url).stop()
                self.drop(url)
            elif link is not None and probe.result != link.version:
                log.warning("engine %s reports version %s, not %s: it restarted; new push group",
                            url, probe.result, link.version)  # fmt: skip
                self.drop(url)
        forming = {u: self._form(u) for u in engines if u not in failed and u not in self.links}
        deadline = time.monotonic() + self.timeout_s
        while forming:
            for url, (link, init, group) in list(forming.items()):
                if group.done and not group.error:
                    if init.wait(deadline - time.monotonic()) and not init.error:
                        link.group = group.result
                        self.links[url] = link
                        log.info("push group %s formed with %s", link.name, url)
                    else:
                        failed[url] = f"init_group: {init.error or 'no answer'}"
                        release_when_done(Link(url, link.name, group.result, link.store), [])
                elif (group.error or (init.done and init.error) or self.beats[url].silent
                      or time.monotonic() > deadline):  # fmt: skip
                    # The group's construction, if still waiting for the engine, ends at its
                    # own timeout on its thread; this push does not wait for it.
                    silent = SILENT if self.beats[url].silent else "timed out"
                    failed[url] = f"init_group: {init.error or group.error or silent}"
                else:
                    continue
                del forming[url]
            if forming:
                time.sleep(0.05)
        live = [self.links[u] for u in engines if u in self.links and u not in failed]
        self.paused = {link.url for link in live}
        for url in [u for u in self.beats if u not in self.paused]:
            self.beats.pop(url).stop()
        pausing = {link.url: self.start(link.url, self.protocol.before_update()) for link in live}
        until = time.monotonic() + self.timeout_s
        for url, job in pausing.items():
            if not wait_job(job, until, self.beats[url]) or job.error:
                failed[url] = job.error or (SILENT if self.beats[url].silent else
                                            "before_update: no answer")  # fmt: skip
                self.drop(url)
        return [link for link in live if link.url not in failed]

    def _beat(self, url: str) -> Heartbeat:
        pulse = None if self.pulse is None else functools.partial(self.pulse, url)
        return Heartbeat(url, self.protocol, self.headers, self.silent_s, self.stopped_s, pulse)

    def end_push(self) -> list[str]:
        """Stop watching the engines of the push that ended; those that had fallen silent."""
        silent = [url for url, beat in self.beats.items() if beat.silent]
        for beat in self.beats.values():
            beat.stop()
        self.beats = {}
        return silent

    def finish(
        self,
        done: Sequence[Link],
        updates: dict[str, Job],
        version: int,
        deadline: float,
        failed: dict[str, str],
    ) -> None:
        """Each engine on its own thread: its ``update`` answer, then ``after_update``. An engine
        that finished is at ``version``; one that did not lands in ``failed``, its link dropped."""

        def finish(link: Link) -> int:
            update = updates[link.url]
            if not update.wait(deadline - time.monotonic()):
                raise WeightControlError(f"{link.url}: no answer to the update call")
            if update.error:
                raise WeightControlError(update.error)
            self.send(link.url, self.protocol.after_update(version))
            return version

        finishing = {link.url: Job(functools.partial(finish, link)) for link in done}
        for link in done:
            job, beat = finishing[link.url], self.beats.get(link.url)
            if wait_job(job, deadline + 5, beat) and not job.error:
                link.version = version
            else:
                silent = beat is not None and beat.silent and not job.done
                failed[link.url] = job.error or (
                    SILENT if silent else "no answer before learner.push.timeout_s"
                )
                self.drop(link.url)

    def recover(self, engines: Sequence[str], silent: Sequence[str] = ()) -> None:
        """Best effort after a failed push: no engine may stay paused (a dead one refuses at
        once; a short deadline for the rest). Engines in ``silent`` (stopped answering) are sent
        the calls without waiting: their answer would only come once they run again."""
        calls = self.protocol.recover()
        if not engines or not calls:
            return
        jobs = {
            u: Job(functools.partial(self.send, u, calls, min(PROBE_TIMEOUT_S, self.timeout_s)))
            for u in engines
        }
        errors = [
            j.error or "no answer"
            for u, j in jobs.items()
            if u not in silent and (not j.wait(PROBE_TIMEOUT_S + 5) or j.error)
        ]
        if errors:
            log.warning("recovering engines after a failed push: %s", "; ".join(errors))

    def close(self) -> None:
        self.end_push()
        for url in list(self.links):
            self.drop(url)
