"""The ``judge`` kind: an LLM behind an OpenAI-compatible API rates a response; a regex reads the
score from its answer.

Each ``reward.judges.<name>`` is one endpoint, called with its prompt template filled with the
item's ``prompt``, ``response`` and ``reference``: as chat messages to ``/v1/chat/completions``
(vLLM, SGLang, hosted APIs) or, with ``api: completions``, as a text prompt to
``/v1/completions`` (engines without a chat route, such as the embedded one). At most
``concurrency`` requests per judge are in flight; each attempt has ``timeout_s``; timeouts,
connection errors, 429 and 5xx are retried ``retries`` times with the project's back-off
(:class:`dynamo_rl.retry.Backoff`: ``retry_backoff_s`` doubling up to ``retry_backoff_max_s``).

Outcomes, as ``reason``: ``ok``/``wrong_answer`` (parsed; normalised score against
``correct_above``), ``unparseable`` (no score in the answer, or one outside the scale; ``detail``
quotes the answer), ``timeout`` (every attempt timed out), ``upstream_error`` (the endpoint
refused or failed). Failures score 0; they are never retried forever nor turned into 1.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx

from dynamo_rl.config.reward import JudgeSpec
from dynamo_rl.contracts.engine import CompletionRequest
from dynamo_rl.contracts.reward import ItemResult, JudgeItem, Reason
from dynamo_rl.retry import Backoff, Retrying
from services.reward.base import NamedScorer
from services.reward.metrics import RewardMetrics

QUOTE_CHARS = 200


@dataclass
class Verdict:
    reason: Reason
    score: float = 0.0
    raw: float | None = None
    detail: str = ""


def parse_score(spec: JudgeSpec, answer: str) -> float | None:
    """The last match of ``score_pattern`` as a number on the judge's scale, else ``None``."""
    matches = list(re.finditer(spec.score_pattern, answer))
    if not matches:
        return None
    try:
        value = float(matches[-1].group(1))
    except (TypeError, ValueError):
        return None
    if not spec.min_score <= value <= spec.max_score:
        return None
    return value


def _quote(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…")


class JudgeClient:
    """One judge endpoint: request building, bounded concurrency, retries, parsing."""

    def __init__(self, name: str, spec: JudgeSpec, metrics: RewardMetrics) -> None:
        self.name, self.spec, self.metrics = name, spec, metrics
        self._sem = asyncio.Semaphore(spec.concurrency)
        headers = {}
        if spec.api_key_env:
            token = os.environ.get(spec.api_key_env, "")
            if token:
                headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            base_url=spec.url.rstrip("/"),
            headers=headers,
            timeout=spec.timeout_s,
            limits=httpx.Limits(max_connections=spec.concurrency),
        )

    async def close(self) -> None:
        await self._http.aclose()

    def request(self, prompt: str, response: str, reference: str) -> tuple[str, dict[str, Any]]:
        s = self.spec
        text = s.template.format(prompt=prompt, response=response, reference=reference)
        if s.api == "completions":  # an engine's route: its body is the engine contract's
            request = CompletionRequest(
                model=s.model, prompt=text, max_tokens=s.max_tokens, temperature=s.temperature
            )
            return "/v1/completions", request.body()
        # Chat completions: an external judge's API, which no engine of ours serves.
        body: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature}
        if s.model is not None:
            body["model"] = s.model
        messages = [{"role": "system", "content": s.system}] if s.system else []
        messages.append({"role": "user", "content": text})
        return "/v1/chat/completions", {**body, "messages": messages}

    @staticmethod
    def answer_text(body: Any) -> str:
        choice = body["choices"][0]
        if "message" in choice:
            return str(choice["message"].get("content") or "")
        return str(choice.get("text") or "")

    async def judge(self, prompt: str, response: str, reference: str) -> Verdict:
        path, body = self.request(prompt, response, reference)
        s = self.spec
        attempts = s.retries + 1
        last = Verdict("upstream_error", detail="no attempt made")
        retrying = Retrying(
            f"judge {self.name!r}",
            Backoff(base_s=s.retry_backoff_s, cap_s=s.retry_backoff_max_s),
            max_attempts=s.retries,
        )
        async with self._sem:
            for attempt in range(attempts):
                if attempt:  # within max_attempts by the loop's bound: never exhausted
                    await asyncio.sleep(retrying.next_delay(last.detail))
                outcome = "ok"
                try:
                    # httpx's timeout is per read; wait_for caps the whole attempt (a judge
                    # that trickles bytes must not hold a slot for ever).
                    r = await asyncio.wait_for(self._http.post(path, json=body), s.timeout_s)
                except (httpx.TimeoutException, TimeoutError):
                    outcome = "timeout"
                    last = Verdict(
                        "timeout",
                        detail=f"judge {self.name!r} did not answer within {s.timeout_s}s "
                        f"({attempt + 1}/{attempts} attempts; reward.judges.{self.name}.timeout_s)",
                    )
                    continue
                except httpx.HTTPError as e:
                    outcome = "connect_error"
                    last = Verdict(
                        "upstream_error", detail=f"judge {self.name!r}: {type(e).__name__}: {e}"
                    )
                    continue
                finally:
                    self.metrics.judge_requests.labels(self.name, outcome).inc()
                if r.status_code == 429 or r.status_code >= 500:
                    last = Verdict(
                        "upstream_error",
                        detail=f"judge {self.name!r} answered {r.status_code}: {r.text[:200]}",
                    )
                    continue
                if r.status_code != 200:  # a request the judge refuses will not get better
                    return Verdict(
                        "upstream_error",
                        detail=f"judge {self.name!r} answered {r.status_code}: {r.text[:200]}",
                    )
                try:
                    answer = self.answer_text(r.json())
                except (ValueError, KeyError, IndexError, TypeError):
                    return Verdict(
                        "upstream_error",
                        detail=f"judge {self.name!r}: not an OpenAI completion: {r.text[:200]}",
                    )
                return self.verdict(answer)
        return last

    def verdict(self, answer: str) -> Verdict:
        s = self.spec
        value = parse_score(s, answer)
        if value is None:
            return Verdict(
                "unparseable",
                detail=f"judge {self.name!r}: no score on the scale [{s.min_score:g}, "
                f"{s.max_score:g}] matching reward.judges.{self.name}.score_pattern in its "
                f"answer {_quote(answer)}",
            )
        norm = (value - s.min_score) / (s.max_score - s.min_score)
        reason: Reason = "ok" if norm >= s.correct_above else "wrong_answer"
        return Verdict(reason, norm, value, f"judge {self.name!r}: {value:g}")


class JudgeScorer(NamedScorer):
    kind = "judge"
    item_model = JudgeItem
    field = "judge"

    async def start(self) -> None:
        # httpx clients bind to the running loop, so they are made here, not in __init__.
        self.clients = {n: JudgeClient(n, s, self.metrics) for n, s in self.cfg.judges.items()}

    async def score(self, item: JudgeItem) -> ItemResult:
        name = self.entry(item)
        start = time.monotonic()
        v = await self.clients[name].judge(item.prompt, item.response, item.reference)
        self.metrics.item_seconds.labels(self.kind).observe(time.monotonic() - start)
        return ItemResult(
            id=item.id, score=v.score, correct=v.reason == "ok", format_ok=True,
            reason=v.reason, detail=v.detail, raw_score=v.raw,
        )  # fmt: skip
