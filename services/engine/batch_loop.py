"""The scheduler thread and its one batch loop: queued sequences decoded together with a KV cache.

Why one thread: the model is only ever touched by the scheduler thread, so a weight update (run
by that same thread between batches, or between two tokens of a batch) can never interleave with
a decoding step, and no lock is needed. With LoRA adapters loaded (:mod:`.adapters`) a batch holds
one adapter's sequences (or the base's), switched to between batches, and they carry that
adapter's version.

When the engine is idle, the first request waits ``batch_wait_s`` for others to arrive (again
while a burst keeps arriving, up to 20 windows). Then one loop decodes a batch step by step
sharing one KV cache (:mod:`.kv_cache`; the prompts prefilled together with left padding) and
samples each row's next token (:mod:`.sampler`). Finished rows leave the cache as they finish, and
each sequence's result goes to its request as soon as the request's last sequence finishes.

Which queued sequences a batch takes in is one rule, :class:`JoinRule`: a new batch takes up to
``max_batch_size``; a running one takes in more at a token boundary once ``every`` steps have
passed since it began or last took rows in, up to ``max_batch_size`` rows. Whatever it takes
stops at the queue's first exclusive task (a waiting update, a ``wait`` or ``abort`` pause, an
adapter load) or first job of another adapter: the batch drains and the task (or that adapter's
batch) runs after it. ``engine.batching`` picks the rule:

- ``static`` (the default): ``every`` is None, a running batch takes nothing in, so a batch lasts
  as long as its longest sequence while its other rows sit finished;
- ``continuous``: ``every`` is :data:`JOIN_EVERY`; the joining prompts are prefilled on their own
  and their cache rows appended to the batch's (:func:`~.kv_cache.merge`; a cache of another
  kind, e.g. sliding-window layers, is rebuilt over every row instead, as after an interruptible
  update), and positions no row attends to any more are dropped (:func:`~.kv_cache.trim`). A
  join that fails fails the joining requests only.

Weight updates come as exclusive tasks (:meth:`BatchGenerator.run_exclusive`), in one of two ways:

- **between batches** (waiting updates, the default): a batch that started on version v
  finishes on version v, and the sequences of one request never straddle the update (it runs
  after all of that request's sequences);
- **between tokens** (``between_tokens``, interruptible updates): the running batch stops at its
  next token boundary, the task runs, and when the weights changed the batch's cache is rebuilt
  by one forward pass over each row's prompt and tokens so far, under the new weights; decoding
  then goes on. Every token records the version whose weights gave its logits
  (:attr:`SequenceResult.token_versions`), so a sequence that spans an update carries both
  versions, and each token's log-prob is what a full forward pass of that version gives.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from dynamo_rl.contracts.sampling import SamplingParams
from services.engine.kv_cache import (
    CacheState,
    cache_kwarg,
    left_padded,
    merge,
    mergeable,
    new_cache,
    trim,
)
from services.engine.sampler import (
    LOGPROBS_MODES,
    Draw,
    row_generator,
    sample,
    top_alternatives,
)

log = logging.getLogger(__name__)

JOIN_EVERY = 8
"""``continuous`` batching: decoding steps between two joins of one batch (each join is one
prefill of the joining prompts)."""


@dataclass(frozen=True)
class JoinRule:
    """When queued sequences join a batch (see the module docstring): a batch with no rows yet
    takes up to ``max_batch_size``; a running one every ``every`` decoding steps (None: never)."""

    every: int | None = None

    @property
    def joins(self) -> bool:
        """Whether a running batch ever takes rows in (so it may live on through joins)."""
        return self.every is not None

    def room(self, rows: int, steps: int, max_rows: int) -> int:
        """How many queued sequences a batch of ``rows`` active rows, ``steps`` decoding steps
        after it began or last took rows in, takes in now (0: none)."""
        if rows and (self.every is None or steps < self.every):
            return 0
        return max(max_rows - rows, 0)


JOIN_RULES = {"static": JoinRule(None), "continuous": JoinRule(JOIN_EVERY)}
"""``engine.batching`` -> its join rule."""
BATCHING_MODES = tuple(JOIN_RULES)


@dataclass
class SequenceResult:
    """One generated sequence."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    matched_stop: int | str | None
    stop_text_end: int | None  # where the text is cut when a stop string matched
    top_logprobs: list[list[tuple[int, float]]] | None
    weight_version: int
    """The oldest version among its tokens' (the engine's when it has none)."""
    token_versions: list[int] = field(default_factory=list)
    """The weight version that sampled each token (one per token id)."""


@dataclass
class _Seq:
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    top_logprobs: int = 0  # alternatives per token to return (0: only the sampled token's)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass
class _Job:
    seqs: list[_Seq]
    future: Future[list[SequenceResult]]
    results: list[SequenceResult | None]
    next_index: int = 0  # sequences before this one are already scheduled
    done: int = 0
    adapter: str | None = None  # the LoRA adapter its sequences run with (None: the base)


@dataclass
class _Task:
    fn: Callable[[], Any]
    future: Future[Any]
    between_tokens: bool = False
    """Run at the running batch's next token boundary, not after the batch."""


@dataclass
class BatchStats:
    """What one decoded batch did (for metrics); of a batch that took rows in, what it did from
    one join to the next."""

    sequences: int
    """Sequences it took in."""
    prompt_tokens: int
    generated_tokens: int
    seconds: float
    rows: int = 0
    """Rows decoded together (after the join; 0: ``sequences``)."""


class BatchGenerator:
    """Owns the model in a scheduler thread; ``submit`` sequences, ``run_exclusive`` updates."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        decode: Callable[[list[int]], str],
        max_batch_size: int = 64,
        batch_wait_s: float = 0.002,
        seed: int = 0,
        on_batch: Callable[[BatchStats], None] | None = None,
        logprobs_mode: str = "processed",
        select_adapter: Callable[[str | None], int | None] | None = None,
        batching: str | JoinRule = "static",
    ) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}"
            )
        if isinstance(batching, str) and batching not in JOIN_RULES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {batching!r}")
        self.join = JOIN_RULES[batching] if isinstance(batching, str) else batching
        """Which queued sequences a batch takes in (``engine.batching``)."""
        self.logprobs_mode = logprobs_mode
        self.model = model
        self.device = next(model.parameters()).device
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.decode = decode
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.on_batch = on_batch
        # Switches the model to a batch's adapter (scheduler thread); the version its samples
        # carry, or None: the weight version.
        self.select_adapter = select_adapter
        self.weight_version = 0
        self.weights_epoch = 0  # bumped by every change of the weights (see run_exclusive)
        self.abort = threading.Event()  # set: running sequences end now with "abort"
        self._cache_kw = cache_kwarg(model)
        self._rng = torch.Generator(device="cpu").manual_seed(seed)
        self._queue: collections.deque[_Job | _Task] = collections.deque()
        self._cv = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()

    # ---- public API (any thread) ----

    def submit(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[SamplingParams],
        adapter: str | None = None,
        top_logprobs: int = 0,
    ) -> Future[list[SequenceResult]]:
        """Queue sequences (one per (prompt, params) pair), run with LoRA ``adapter`` (None: the
        base), each returning the ``top_logprobs`` most likely alternatives of every token (0:
        only the sampled token's log-prob); the future gets results in order. ``params``'s
        ``seed`` is each sequence's own (:func:`~.sampler.sample_seed`)."""
        if len(prompts) != len(params):
            raise ValueError("one SamplingParams per prompt")
        seqs = []
        for prompt, p in zip(prompts, params, strict=True):
            seqs.append(_Seq(list(prompt), p, row_generator(p.seed), top_logprobs))
        job = _Job(seqs, Future(), [None] * len(seqs), adapter=adapter)
        if not seqs:
            job.future.set_result([])
            return job.future
        self._put(job)
        return job.future

    def run_exclusive(self, fn: Callable[[], Any], between_tokens: bool = False) -> Future[Any]:
        """Run ``fn`` in the scheduler thread between batches (weight updates), or with
        ``between_tokens`` at the running batch's next token boundary (after the batch's
        earlier tokens, before its next one); when ``fn`` changes the weights it bumps
        :attr:`weights_epoch`, and the batch's cache is rebuilt under the new weights."""
        task = _Task(fn, Future(), between_tokens)
        self._put(task)
        return task.future

    def pending(self) -> int:
        """Sequences queued and not yet scheduled."""
        with self._cv:
            return sum(len(j.seqs) - j.next_index for j in self._queue if isinstance(j, _Job))

    def pending_tasks(self) -> int:
        """Exclusive tasks (weight updates, pauses, adapter loads) queued and not yet run."""
        with self._cv:
            return sum(isinstance(t, _Task) for t in self._queue)

    def close(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        self._thread.join(timeout=30)

    # ---- scheduler thread ----

    def _put(self, item: _Job | _Task) -> None:
        with self._cv:
            if self._stopped:
                raise RuntimeError("engine is shutting down")
            self._queue.append(item)
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    break
                head = self._queue[0]
            if isinstance(head, _Task):
                with self._cv:
                    self._queue.popleft()
                self._run_task(head)
                continue
            self._gather()
            batch = self._take_batch(self.join.room(0, 0, self.max_batch_size))
            if batch:
                self._run_batch(batch)
        # Fail whatever is left so no caller waits forever.
        with self._cv:
            left = list(self._queue)
            self._queue.clear()
        for item in left:
            if not item.future.done():
                item.future.set_exception(RuntimeError("engine shut down"))

    def _gather(self) -> None:
        """Let requests that arrive together join one batch.

        Wait ``batch_wait_s``; while more sequences keep arriving (a burst of requests still
        being parsed by the HTTP server) and the batch is not full, wait again, up to 20 windows.
        """
        if self.batch_wait_s <= 0:
            return
        seen = self.pending()
        for _ in range(20):
            time.sleep(self.batch_wait_s)
            now = self.pending()
            if now == seen or now >= self.max_batch_size:
                return
            seen = now

    def _run_task(self, task: _Task) -> None:
        try:
            task.future.set_result(task.fn())
        except BaseException as e:  # report to the caller, keep serving
            task.future.set_exception(e)

    def _take_batch(
        self, room: int, adapter: str | None = None, joining: bool = False
    ) -> list[tuple[_Job, int]]:
        """Up to ``room`` queued sequences (the join rule's), stopping at the first exclusive
        task or the first job of another adapter (one adapter per batch; ``joining`` a running
        batch: only jobs of its ``adapter``)."""
        batch: list[tuple[_Job, int]] = []
        with self._cv:
            while self._queue and len(batch) < room:
                head = self._queue[0]
                if isinstance(head, _Task):
                    break
                first = adapter if joining else (batch[0][0].adapter if batch else head.adapter)
                if head.adapter != first:
                    break
                take = min(len(head.seqs) - head.next_index, room - len(batch))
                batch.extend((head, head.next_index + k) for k in range(take))
                head.next_index += take
                if head.next_index == len(head.seqs):
                    self._queue.popleft()
        return batch

    def _run_batch(self, batch: list[tuple[_Job, int]]) -> None:
        """Decode ``batch`` (which grows as queued sequences join it: ``continuous``)."""
        try:
            stamp = None
            if self.select_adapter is not None:
                stamp = self.select_adapter(batch[0][0].adapter)
            with torch.inference_mode():
                self._decode(batch, stamp)
        except BaseException as e:
            log.exception("generation failed for a batch of %d sequences", len(batch))
            self._fail(batch, e)

    @staticmethod
    def _deliver(entry: tuple[_Job, int], result: SequenceResult) -> None:
        """One sequence's result; its request's future completes with its last sequence."""
        job, i = entry
        job.results[i] = result
        job.done += 1
        if job.done == len(job.seqs) and not job.future.done():
            job.future.set_result(list(job.results))  # type: ignore[arg-type]

    def _stats(self, t0: float, seqs: list[_Seq], generated: int, rows: int) -> None:
        """Report a batch, or the part of a continuous batch since it last took rows in: the
        sequences it took in (``seqs``), the rows decoded together after it took them in and
        the tokens decoded meanwhile."""
        if self.on_batch is not None:
            self.on_batch(
                BatchStats(
                    sequences=len(seqs),
                    prompt_tokens=sum(len(s.prompt) for s in seqs),
                    generated_tokens=generated,
                    seconds=time.perf_counter() - t0,
                    rows=rows,
                )
            )

    def _fail(self, entries: Sequence[tuple[_Job, int]], error: BaseException) -> None:
        """Fail the requests of ``entries`` (their other sequences' results are dropped)."""
        for job, _ in entries:
            if not job.future.done():
                job.future.set_exception(error)

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        return out.logits[:, -1, :].float()

    def _prefill(self, rows: list[list[int]]) -> CacheState:
        """A fresh cache over ``rows`` (left padded): the cache, the last position's logits, the
        attention mask and each row's next position."""
        ids, mask, positions = left_padded(rows, self.pad_token_id, self.device)
        cache = new_cache(self.model)
        logits = self._forward(ids, mask, positions, cache)
        return CacheState(cache, logits, mask, positions[:, -1] + 1)

    def _interrupt(self) -> bool:
        """Run the tasks queued to run between tokens (interruptible updates, a keep pause);
        True when the weights changed, so the running batch's cache must be rebuilt."""
        with self._cv:
            tasks = [t for t in self._queue if isinstance(t, _Task) and t.between_tokens]
            for t in tasks:
                self._queue.remove(t)
        epoch = self.weights_epoch
        for t in tasks:
            self._run_task(t)
        return self.weights_epoch != epoch

    def _admit(self, batch: list[tuple[_Job, int]], start: int, active: list[int]) -> None:
        """Rows ``start:`` of ``batch`` become active; those that need no generation at all
        (max_tokens == 0) are answered at once."""
        for i in range(start, len(batch)):
            job, k = batch[i]
            s = job.seqs[k]
            if s.params.max_tokens == 0:
                self._deliver(batch[i], self._result(s, "length", None, None))
            else:
                active.append(i)

    def _decode(self, batch: list[tuple[_Job, int]], stamp: int | None = None) -> None:
        """Decode ``batch`` to the end, answering each sequence as it finishes. ``stamp``: the
        version every token of a LoRA adapter's batch carries (an adapter's weights never change
        under a batch), or None: each token the weights' version."""
        seqs = [job.seqs[i] for job, i in batch]
        active: list[int] = []  # active[r] = index into batch/seqs of cache row r
        self._admit(batch, 0, active)
        t_seg, seg_seqs, seg_rows, generated = time.perf_counter(), list(seqs), len(seqs), 0
        if not active:
            self._stats(t_seg, seg_seqs, generated, seg_rows)
            return

        dev = self.device
        cache, logits, mask, next_pos = self._prefill([seqs[i].prompt for i in active])
        # The weights the cache and logits came from (an adapter's version for its batch).
        version = self.weight_version if stamp is None else stamp
        since_join = 0
        while active:
            tokens, token_lp, step_logp = self._sample(logits, [seqs[i] for i in active])
            keep: list[int] = []
            # One conversion per step, not one per row.
            step_tokens, step_lps = tokens.tolist(), token_lp.tolist()
            generated += len(active)
            for r, i in enumerate(active):
                s = seqs[i]
                tok = step_tokens[r]
                s.tokens.append(tok)
                s.logprobs.append(step_lps[r])
                s.versions.append(version)
                if s.top_logprobs:
                    s.top.append(top_alternatives(step_logp[r], s.top_logprobs))
                done = self._finished(s, tok)
                if done is None and self.abort.is_set():
                    done = ("abort", None, None)
                if done is None:
                    keep.append(r)
                else:
                    reason, matched, cut = done
                    self._deliver(batch[i], self._result(s, reason, matched, cut))
            if not keep:
                break
            trimmed = self.join.joins and mergeable(cache)
            if len(keep) < len(active):
                sel = torch.tensor(keep, device=dev)
                cache.batch_select_indices(sel)
                mask, next_pos, tokens = mask[sel], next_pos[sel], tokens[sel]
                active = [active[r] for r in keep]
                if trimmed:
                    mask = trim(cache, mask)
            changed = self._interrupt()
            since_join += 1
            joined = 0
            room = self.join.room(len(active), since_join, self.max_batch_size)
            if room and not self.abort.is_set():
                more = self._take_batch(room, batch[0][0].adapter, joining=True)
                if more:
                    start = len(batch)
                    batch.extend(more)
                    self._stats(t_seg, seg_seqs, generated, seg_rows)
                    seg_seqs = [job.seqs[i] for job, i in more]
                    seqs.extend(seg_seqs)
                    t_seg, generated, since_join = time.perf_counter(), 0, 0
                    before = len(active)
                    self._admit(batch, start, active)
                    joined = len(active) - before
                    seg_rows = len(active)
            if changed or (joined and not mergeable(cache)):
                # New weights mid-batch: the cache holds the old weights' keys and values, so it
                # is rebuilt over each row's prompt and tokens so far, and the next token's
                # logits come from the new weights alone (what the learner recomputes).
                rebuilt = [seqs[i].prompt + seqs[i].tokens for i in active]
                cache, logits, mask, next_pos = self._prefill(rebuilt)
                version = self.weight_version if stamp is None else stamp
                continue
            old = len(active) - joined
            mask = torch.cat([mask, mask.new_ones((old, 1))], dim=1)
            logits = self._forward(tokens[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1
            if joined:
                # New rows: their prompts are prefilled on their own and their cache rows
                # appended to the batch's (the narrower side left padded, masked out). A failure
                # there fails the joining requests only; the batch goes on without them.
                try:
                    fresh = self._prefill([seqs[i].prompt for i in active[old:]])
                    cache, logits, mask, next_pos = merge((cache, logits, mask, next_pos), fresh)
                except Exception as e:
                    log.exception("%d sequences failed to join the running batch", joined)
                    self._fail([batch[i] for i in active[old:]], e)
                    active = active[:old]
                else:
                    mask = trim(cache, mask)
        self._stats(t_seg, seg_seqs, generated, seg_rows)

    def _sample(self, logits: torch.Tensor, seqs: list[_Seq]) -> Draw:
        """One step's draw for the rows ``seqs`` (:func:`~.sampler.sample`)."""
        return sample(
            logits, [s.params for s in seqs], [s.generator for s in seqs], self._rng,
            self.logprobs_mode,
        )  # fmt: skip

    def _finished(self, s: _Seq, tok: int) -> tuple[str, int | str | None, int | None] | None:
        p = s.params
        if tok in p.stop_token_ids:
            return "stop", tok, None
        if not p.ignore_eos and tok in self.eos_token_ids:
            return "stop", tok, None
        if p.stop:
            text = self.decode(s.tokens)
            hits = [(text.find(stop), stop) for stop in p.stop if stop in text]
            if hits:
                cut, stop = min(hits)
                return "stop", stop, cut
        if len(s.tokens) >= p.max_tokens:
            return "length", None, None
        return None

    def _result(
        self,
        s: _Seq,
        reason: str,
        matched: int | str | None,
        cut: int | None,
    ) -> SequenceResult:
        return SequenceResult(
            token_ids=list(s.tokens),
            logprobs=list(s.logprobs),
            finish_reason=reason,
            matched_stop=matched,
            stop_text_end=cut,
            top_logprobs=list(s.top) if s.top_logprobs else None,
            weight_version=min(s.versions, default=self.weight_version),
            token_versions=list(s.versions),
        )
