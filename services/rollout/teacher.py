"""On-policy distillation's teacher stage (``rollout.teacher``, ``docs/learner.md``).

After sampling (and verifying), every response of a batch's groups is scored under the teacher:
the teacher's log-prob of each response token after the response's prompt
(:meth:`OpenAICompletionsEngine.score`, vLLM's ``prompt_logprobs`` on ``/v1/completions``),
written to ``Response.teacher_logprobs`` beside the sampling log-probs before the push. A
teacher that cannot be reached (connection refused, timeout, 5xx) is retried with the one retry
policy (:mod:`dynamo_rl.retry`), each retry on the next teacher engine, until it answers or
``max_wait_s`` runs out: nothing is pushed unscored. A request the teacher refuses (4xx) or an
answer that does not fit fails the batch at once.

The teacher's tokenizer must be the student's, since the student's token ids are scored as they
are: :func:`check_tokenizers` refuses a mismatch when the worker starts.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

from dynamo_rl.codec import TrajectoryGroup
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.config.rollout import TeacherConfig
from dynamo_rl.retry import Backoff, RetryPolicy, aretry_call
from services.rollout.engines import EngineUnavailable
from services.rollout.engines.openai import OpenAICompletionsEngine
from services.rollout.metrics import WorkerMetrics

__all__ = ["TeacherStage", "build_teacher", "check_tokenizers"]


def check_tokenizers(student: str | Path, teacher: str | Path) -> None:
    """Refuse a teacher tokenizer that is not the student's: the same vocabulary (every token
    under the same id) and the same special tokens; ValueError naming both directories."""
    from transformers import AutoTokenizer

    a = AutoTokenizer.from_pretrained(str(student), local_files_only=True)
    b = AutoTokenizer.from_pretrained(str(teacher), local_files_only=True)
    va, vb = a.get_vocab(), b.get_vocab()
    reason = None
    if len(va) != len(vb):
        reason = f"{len(va)} tokens against {len(vb)}"
    else:
        for token, i in sorted(va.items(), key=lambda kv: kv[1]):
            if vb.get(token) != i:
                reason = (
                    f"token {token!r} is id {i} in the student's, {vb.get(token)} in the teacher's"
                )
                break
    if reason is None and a.all_special_tokens != b.all_special_tokens:
        reason = f"special tokens {a.all_special_tokens} against {b.all_special_tokens}"
    if reason is not None:
        raise ValueError(
            f"rollout.teacher.tokenizer: the teacher's tokenizer ({teacher}) is not the "
            f"student's ({student}): {reason}. On-policy distillation scores the student's token "
            "ids under the teacher, so both models must share one tokenizer"
        )


class TeacherStage:
    """Scores the responses of trajectory groups under the teacher's engines."""

    def __init__(
        self,
        cfg: TeacherConfig,
        *,
        backoff_s: float = 0.5,
        backoff_max_s: float = 10.0,
        on_retry: Callable[[str, float], None] | None = None,
    ) -> None:
        self.engines = [
            OpenAICompletionsEngine(url, model=cfg.model_name, timeout_s=cfg.request_timeout_s)
            for url in cfg.engine_urls
        ]
        self.retry = RetryPolicy(
            Backoff(base_s=backoff_s, cap_s=backoff_max_s),
            max_wait_s=cfg.max_wait_s or None,
            on_retry=on_retry,
        )
        self._turn = itertools.cycle(range(len(self.engines)))
        self._slots = asyncio.Semaphore(cfg.max_concurrency)

    async def score_one(self, prompt: Sequence[int], response: Sequence[int]) -> list[float]:
        """The teacher's log-prob of each ``response`` token after ``prompt``, retried on the next
        engine while the teacher is unreachable."""
        if not response:
            return []

        async def attempt() -> list[float]:
            return await self.engines[next(self._turn)].score(prompt, response)

        async with self._slots:
            return await aretry_call(
                attempt, retry_on=(EngineUnavailable,), retrying=self.retry.start("teacher")
            )

    async def score(self, groups: Sequence[TrajectoryGroup]) -> None:
        """Fill ``teacher_logprobs`` of every response of ``groups`` (in place)."""
        jobs = [
            (r, list(r.prompt_token_ids or g.prompt_token_ids)) for g in groups for r in g.responses
        ]
        scores = await asyncio.gather(*(self.score_one(p, list(r.token_ids)) for r, p in jobs))
        for (r, _), lps in zip(jobs, scores, strict=True):
            r.ClearField("teacher_logprobs")
            r.teacher_logprobs.extend(lps)

    async def aclose(self) -> None:
        for engine in self.engines:
            await engine.aclose()


def build_teacher(
    cfg: ExperimentConfig, student_tokenizer: str | Path, metrics: WorkerMetrics
) -> TeacherStage | None:
    """``rollout.teacher``'s stage (None: no teacher), its tokenizer checked against the
    student's first; its retries are counted as ``teacher`` waits."""
    tc, rc = cfg.rollout.teacher, cfg.rollout
    if tc is None:
        return None
    check_tokenizers(student_tokenizer, tc.tokenizer)
    return TeacherStage(
        tc, backoff_s=rc.backoff_s, backoff_max_s=rc.backoff_max_s,
        on_retry=lambda _reason, seconds: metrics.waited("teacher", seconds),
    )  # fmt: skip
