"""Client of an OpenAI-compatible ``POST /v1/completions`` engine: vLLM, SGLang or the embedded
engine (``docs/contracts.md``); and of its ``POST /v1/chat/completions`` (vLLM, the embedded
engine): :meth:`OpenAICompletionsEngine.chat`.

The prompt goes as token ids and ``return_token_ids: true`` asks for each choice's ``token_ids``
(vLLM's name), so the trainer sees exactly the tokens that were sampled, never a re-tokenisation of
the text; ``logprobs: 0`` returns the sampled token's log-probability in
``logprobs.token_logprobs``. The request is a
:class:`~dynamo_rl.contracts.engine.CompletionRequest` and the answer is read through
:class:`~dynamo_rl.contracts.engine.CompletionResponse`; a response that does not fit, or whose
lengths disagree, is refused (:class:`EngineProtocolError`) rather than silently misaligned.

Weight versions: the embedded engine's ``weight_versions`` (one per token) are kept; with vLLM's
protocol each request's tokens get the version read just before it. A choice a push's pause cut
(``finish_reason: "abort"``) is retried whole, or — ``continue_aborted``, ``rollout.update_mode:
interrupt`` — continued from its tokens so far once the engine has resumed, so one response can
carry two or more versions (``docs/rollout.md``).

Chat: the server renders the messages with its model's chat template. The request asks for
``logprobs: true`` and vLLM's ``return_tokens_as_token_ids`` and ``return_token_ids``, so each
log-prob entry names its token as ``"token_id:<id>"``: the sampled ids are read from there
(one entry per token, its log-prob beside it) and checked against the choice's ``token_ids``;
the rendered prompt's ids are the response's ``prompt_token_ids``. One parser for both servers.
A chat choice a pause cut is retried whole (a chat turn is not continued).

Scoring (:meth:`OpenAICompletionsEngine.score`, on-policy distillation's teacher): the prompt and
response go as one token-id prompt with vLLM's ``prompt_logprobs: 0``
(:func:`~dynamo_rl.contracts.engine.score_request`); the response tokens' entries are read back
(:func:`parse_scores`). vLLM and the embedded engine answer it alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import TypeAdapter

from dynamo_rl.contracts.chat import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    parse_token_id,
)
from dynamo_rl.contracts.engine import (
    ABORTED,
    CompletionRequest,
    CompletionResponse,
    EngineRequest,
    sampling_knobs,
    score_request,
    scored_logprobs,
)
from dynamo_rl.contracts.sampling import SamplingParams
from dynamo_rl.contracts.weight_control import weight_protocol
from services.rollout.engines._http import (
    ReplicaClient,
    build_request,
    parse_answer,
    token_versions,
)
from services.rollout.engines.base import (
    EngineProtocolError,
    EngineUnavailable,
    Sample,
)

__all__ = [
    "ChatSamples",
    "OpenAICompletionsEngine",
    "chat_request",
    "completion_request",
    "parse_chat",
    "parse_choices",
    "parse_scores",
]

_RESPONSE = TypeAdapter(CompletionResponse)
_CHAT_RESPONSE = TypeAdapter(ChatCompletionResponse)
MAX_CONTINUATIONS = 64
"""Most times one response is continued after a push cut it (one cut per push)."""
RESUME_POLL_S = 0.05
"""How often a cut response's client asks whether the engine has resumed."""


def completion_request(
    model: str, prompt_token_ids: Sequence[int], n: int, sampling: SamplingParams, url: str = ""
) -> CompletionRequest:
    """The request; optional knobs are sent only when set (OpenAI servers differ in extras)."""
    return build_request(
        f"{url}/v1/completions",
        lambda: CompletionRequest(
            model=model, prompt=list(prompt_token_ids), n=n, max_tokens=sampling.max_tokens,
            seed=sampling.seed, logprobs=0, return_token_ids=True, **sampling_knobs(sampling),
        ),
    )  # fmt: skip


def parse_choices(body: Any, url: str, n: int, keep_aborted: bool = False) -> list[Sample]:
    """Samples from a completions response, in choice-index order; an aborted choice is an
    :class:`EngineUnavailable` unless ``keep_aborted`` (its tokens so far, to continue)."""
    response = parse_answer(_RESPONSE, body, f"{url}/v1/completions")
    choices = sorted(response.choices, key=lambda c: c.index)
    if len(choices) != n:
        raise EngineProtocolError(f"{url}: asked for {n} choices, got {len(choices)}")
    samples = []
    for c in choices:
        if c.finish_reason == ABORTED and not keep_aborted:
            # A pause with mode=abort for a weight update cut it: HTTP 200, truncated output.
            raise EngineUnavailable(f"{url}: a request was aborted (weight update); retry it")
        logprobs = None if c.logprobs is None else c.logprobs.token_logprobs
        if c.token_ids is None:
            raise EngineProtocolError(
                f"{url}: choice has no 'token_ids' (the engine must support return_token_ids)"
            )
        if logprobs is None:
            raise EngineProtocolError(f"{url}: choice has no logprobs.token_logprobs")
        if len(c.token_ids) != len(logprobs):
            raise EngineProtocolError(
                f"{url}: {len(c.token_ids)} token ids but {len(logprobs)} log-probs in one choice"
            )
        own = "weight_version" in c.model_fields_set
        versions = token_versions(c.weight_versions, len(c.token_ids), url)
        samples.append(
            Sample(
                token_ids=c.token_ids,
                logprobs=logprobs,
                text=c.text or "",
                finish_reason=c.finish_reason or "stop",
                weight_version=min(versions)
                if versions
                else (c.weight_version if own else response.weight_version),
                engine_url=url,
                weight_versions=versions,
            )
        )
    return samples


def parse_scores(
    body: Any, url: str, prompt: Sequence[int], response: Sequence[int]
) -> list[float]:
    """The log-prob of each ``response`` token after ``prompt`` from a scoring answer
    (:func:`~dynamo_rl.contracts.engine.score_request`)."""
    answer = parse_answer(_RESPONSE, body, f"{url}/v1/completions")
    if len(answer.choices) != 1:
        raise EngineProtocolError(f"{url}: a scoring request got {len(answer.choices)} choices")
    try:
        return scored_logprobs(answer.choices[0], [*prompt, *response], len(prompt))
    except ValueError as e:
        raise EngineProtocolError(f"{url}: {e}") from None


def chat_request(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    n: int,
    sampling: SamplingParams,
    url: str = "",
) -> ChatCompletionRequest:
    """The chat request: the sampled tokens' ids and log-probs asked for in vLLM's convention."""
    return build_request(
        f"{url}/v1/chat/completions",
        lambda: ChatCompletionRequest(
            model=model, messages=[dict(m) for m in messages], n=n,
            max_completion_tokens=sampling.max_tokens, seed=sampling.seed, logprobs=True,
            return_tokens_as_token_ids=True, return_token_ids=True, **sampling_knobs(sampling),
        ),
    )  # fmt: skip


@dataclass
class ChatSamples:
    """A chat request's samples and the token ids its messages were rendered to."""

    prompt_token_ids: list[int] | None
    """The rendered prompt (None when the server does not say)."""
    samples: list[Sample]


def parse_chat(body: Any, url: str, n: int) -> ChatSamples:
    """Samples from a chat response, in choice-index order: each token id read from its log-prob
    entry (``"token_id:<id>"``) and checked against the choice's ``token_ids`` when sent; an
    aborted choice is an :class:`EngineUnavailable`."""
    where = f"{url}/v1/chat/completions"
    response = parse_answer(_CHAT_RESPONSE, body, where)
    choices = sorted(response.choices, key=lambda c: c.index)
    if len(choices) != n:
        raise EngineProtocolError(f"{where}: asked for {n} choices, got {len(choices)}")
    samples = []
    for c in choices:
        if c.finish_reason == ABORTED:
            raise EngineUnavailable(f"{url}: a request was aborted (weight update); retry it")
        content = None if c.logprobs is None else c.logprobs.content
        if content is None:
            raise EngineProtocolError(f"{where}: choice has no logprobs.content")
        try:
            token_ids = [parse_token_id(entry.token) for entry in content]
        except ValueError as e:
            raise EngineProtocolError(
                f"{where}: {e} (the engine must support return_tokens_as_token_ids)"
            ) from None
        if c.token_ids is not None and c.token_ids != token_ids:
            raise EngineProtocolError(
                f"{where}: the choice's token_ids ({len(c.token_ids)}) are not the ids of its "
                f"log-prob entries ({len(token_ids)})"
            )
        versions = token_versions(c.weight_versions, len(token_ids), url)
        samples.append(
            Sample(
                token_ids=token_ids,
                logprobs=[entry.logprob for entry in content],
                text=c.message.content or "",
                finish_reason=c.finish_reason or "stop",
                weight_version=min(versions) if versions else response.weight_version,
                engine_url=url,
                weight_versions=versions,
            )
        )
    return ChatSamples(response.prompt_token_ids, samples)


class OpenAICompletionsEngine(ReplicaClient):
    """One replica behind ``/v1/completions``; versions read through ``weight_api``'s protocol."""

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        weight_api: str = "sglang",
        timeout_s: float = 600.0,
        control_token: str | None = None,
        adapter: str | None = None,
        continue_aborted: bool = False,
    ) -> None:
        super().__init__(
            url, weight_protocol(weight_api), timeout_s=timeout_s, control_token=control_token,
            adapter=adapter,
        )  # fmt: skip
        self.model = model
        self.continue_aborted = continue_aborted
        """``rollout.update_mode: interrupt`` with ``weight_api: vllm``: a choice a push's pause
        (mode abort) cut is continued from its tokens so far once the engine resumes."""

    async def _model_name(self) -> str:
        if self.model is None:
            body = await self.http.request("GET", "/v1/models", timeout_s=10.0)
            data = body.get("data") if isinstance(body, dict) else None
            if not data:
                raise EngineProtocolError(f"{self.url}: GET /v1/models lists no model")
            self.model = str(data[0]["id"])
        return self.model

    async def generate(
        self, prompt_token_ids: Sequence[int], n: int, sampling: SamplingParams
    ) -> list[Sample]:
        samples = await self._complete(prompt_token_ids, n, sampling)
        if self.continue_aborted:
            samples = [await self._continue(prompt_token_ids, s, sampling) for s in samples]
        return samples

    async def _complete(
        self, prompt_token_ids: Sequence[int], n: int, sampling: SamplingParams
    ) -> list[Sample]:
        def build(model: str) -> CompletionRequest:
            return completion_request(model, prompt_token_ids, n, sampling, self.url)

        body, version = await self._post("/v1/completions", build)
        samples = parse_choices(body, self.url, n, keep_aborted=self.continue_aborted)
        return _stamped(samples, version)

    async def score(self, prompt: Sequence[int], response: Sequence[int]) -> list[float]:
        """The served model's log-prob of each ``response`` token after ``prompt`` (no weight
        version is read: a teacher's weights do not change)."""
        url = f"{self.url}/v1/completions"
        model = await self._model_name()
        request = build_request(url, lambda: score_request(model, list(prompt), list(response)))
        body = await self.http.request("POST", "/v1/completions", request.body())
        return parse_scores(body, self.url, prompt, response)

    async def chat(
        self, messages: Sequence[Mapping[str, Any]], n: int, sampling: SamplingParams
    ) -> ChatSamples:
        """``n`` samples for one conversation, rendered by the server's chat template: their
        token ids and log-probs (vLLM's ``"token_id:<id>"`` entries) and the prompt's ids."""

        def build(model: str) -> ChatCompletionRequest:
            return chat_request(model, messages, n, sampling, self.url)

        body, version = await self._post("/v1/chat/completions", build)
        out = parse_chat(body, self.url, n)
        _stamped(out.samples, version)
        return out

    async def _post(
        self, path: str, build: Callable[[str], EngineRequest]
    ) -> tuple[Any, int | None]:
        """The answer to ``build(model)`` posted to ``path``, and the version its samples were
        drawn with when the answer cannot tell (None: it tells)."""
        # A LoRA policy: the request names the newest adapter, so its samples were drawn with
        # exactly that version.
        adapter, before = await self.adapter_to_use()
        request = build(adapter or await self._model_name())
        # vLLM's responses carry no weight version, so with its protocol the version is derived
        # (whatever the body says). Its pushes happen between pause and resume (mode wait:
        # running requests finish first; mode abort: they are cut first), so a response ran
        # wholly under the version read before it or a later one; the one read before is kept,
        # which never understates a sample's staleness (exact whenever no update came in
        # between).
        version: int | None = before
        if self.adapter is None:
            version = await self.weight_version() if self.weights.kind == "vllm" else None
        return await self.http.request("POST", path, request.body()), version

    async def _continue(
        self, prompt: Sequence[int], sample: Sample, sampling: SamplingParams
    ) -> Sample:
        """A choice cut by a push's pause, continued from its tokens so far under the new
        weights (a fresh prefill: the push resets the prefix cache) until it ends on its own;
        each piece keeps the versions it was sampled with."""
        cuts = 0
        while sample.finish_reason == ABORTED:
            cuts += 1
            if cuts > MAX_CONTINUATIONS:
                raise EngineUnavailable(
                    f"{self.url}: a response was cut by {MAX_CONTINUATIONS} weight updates"
                )
            left = sampling.max_tokens - len(sample.token_ids)
            if left <= 0:
                sample.finish_reason = "length"
                return sample
            await self._resumed()
            step = replace(sampling, max_tokens=left)
            [more] = await self._complete([*prompt, *sample.token_ids], 1, step)
            versions = sample.token_versions() + more.token_versions()
            known = None not in versions
            sample = Sample(
                token_ids=sample.token_ids + more.token_ids,
                logprobs=sample.logprobs + more.logprobs,
                text=sample.text + more.text,
                finish_reason=more.finish_reason,
                weight_version=min(versions) if known else None,  # type: ignore[type-var]
                engine_url=self.url,
                weight_versions=versions if known else None,  # type: ignore[arg-type]
            )
        return sample

    async def _resumed(self) -> None:
        """Wait until the engine is no longer paused (a push in progress), so the version read
        before the continuation is the one that samples it."""
        deadline = time.monotonic() + self.http.timeout_s
        while True:
            body = await self.http.request("GET", "/is_paused", timeout_s=10.0)
            if not (isinstance(body, dict) and body.get("is_paused")):
                return
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"{self.url}: still paused after {self.http.timeout_s} s")
            await asyncio.sleep(RESUME_POLL_S)


def _stamped(samples: list[Sample], version: int | None) -> list[Sample]:
    """``samples``, each token's version set to ``version`` when one is given."""
    if version is not None:
        for sample in samples:
            sample.weight_version = version
            sample.weight_versions = [version] * len(sample.token_ids)
    return samples
