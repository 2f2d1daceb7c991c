"""The engine's chat API, ``POST /v1/chat/completions`` (OpenAI chat plus vLLM's extensions): the
request and answer models both ends import, on the base and sampling fields of
:mod:`dynamo_rl.contracts.engine`.

:class:`ChatCompletionRequest` (its ``messages`` checked by :func:`chat_messages` where they are
rendered) -> :class:`ChatCompletionResponse` (:class:`ChatChoice`, :class:`ChatMessage`,
:class:`ChatLogprobs`). The embedded engine renders the messages with its checkpoint's chat
template and samples them as the :class:`~dynamo_rl.contracts.engine.CompletionRequest`
:meth:`ChatCompletionRequest.completion` gives. With ``return_tokens_as_token_ids`` each log-prob
entry's ``token`` is ``"token_id:<id>"`` (vLLM's convention; :func:`token_id_text`,
:func:`parse_token_id`). No torch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from dynamo_rl.contracts.engine import (
    AnsweredVersion,
    CompletionRequest,
    CompletionUsage,
    EngineAnswer,
    SamplingKnobs,
)

__all__ = [
    "CHAT_ROLES",
    "TOKEN_ID_PREFIX",
    "ChatChoice",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatLogprob",
    "ChatLogprobContent",
    "ChatLogprobs",
    "ChatMessage",
    "MessageError",
    "chat_messages",
    "parse_token_id",
    "token_id_text",
]

# ---- POST /v1/chat/completions --------------------------------------------------------------

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
"""The message roles a chat request may use (OpenAI's, less the deprecated ``function``)."""
TOKEN_ID_PREFIX = "token_id:"
"""vLLM's ``return_tokens_as_token_ids``: a log-prob entry's ``token`` is ``"token_id:<id>"``."""


def token_id_text(token_id: int) -> str:
    """The ``token`` of a log-prob entry under ``return_tokens_as_token_ids``."""
    return f"{TOKEN_ID_PREFIX}{token_id}"


def parse_token_id(token: str) -> int:
    """The id in a ``"token_id:<id>"`` string (ValueError when it is not one)."""
    if not token.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"{token!r} is not of the form '{TOKEN_ID_PREFIX}<id>'")
    digits = token[len(TOKEN_ID_PREFIX) :]
    if not digits.isdigit():
        raise ValueError(f"{token!r} is not of the form '{TOKEN_ID_PREFIX}<id>'")
    return int(digits)


class MessageError(ValueError):
    """A chat message the engine cannot render; ``field`` names it (``messages.<i>.<key>``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The messages as a chat template takes them: each an object with a ``role`` of
    :data:`CHAT_ROLES` and a ``content`` that is text or a list of text parts (joined with
    newlines, as vLLM does for templates that take text); an assistant message with
    ``tool_calls`` may have none. Other keys (``name``, ``tool_call_id``, ``tool_calls``) go to
    the template as given. :class:`MessageError` names the first malformed field."""
    if not messages:
        raise MessageError("messages", "must not be empty")
    out = []
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise MessageError(where, f"must be an object with role and content, got {m!r}")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise MessageError(
                f"{where}.role", f"must be one of {', '.join(CHAT_ROLES)}, got {role!r}"
            )
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                text = part.get("text") if isinstance(part, dict) else None
                if not isinstance(text, str) or part.get("type") != "text":
                    raise MessageError(
                        f"{where}.content.{j}",
                        f"only text parts ({{'type': 'text', 'text': ...}}) are served, got "
                        f"{part!r}",
                    )
                texts.append(text)
            content = "\n".join(texts)
        elif content is None:
            if not (role == "assistant" and m.get("tool_calls")):
                raise MessageError(f"{where}.content", "is missing")
        elif not isinstance(content, str):
            raise MessageError(
                f"{where}.content", f"must be text or a list of text parts, got {content!r}"
            )
        out.append({**m, "content": content})
    return out


class ChatCompletionRequest(SamplingKnobs):
    """OpenAI ``POST /v1/chat/completions`` (what an RL rollout uses, plus vLLM's extensions).

    The messages are rendered by the served model's chat template with the generation prompt,
    then sampled exactly as a ``/v1/completions`` request of those token ids would be."""

    model: str | None = None
    messages: list[Any]
    """Checked where they are rendered (:func:`chat_messages`)."""
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    """OpenAI's older name of ``max_completion_tokens`` (which wins when both are given)."""
    max_completion_tokens: Annotated[int, Field(ge=0)] | None = None
    seed: int | None = None
    logprobs: bool = False
    """Each choice carries ``logprobs.content``, one entry per generated token."""
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    """Alternatives per token (needs ``logprobs``)."""
    return_tokens_as_token_ids: bool | None = None
    """vLLM's extension: log-prob entries name their token as ``"token_id:<id>"``."""
    return_token_ids: bool | None = None
    """vLLM's extension: each choice carries ``token_ids``, the response ``prompt_token_ids``."""
    stream: Literal[False] = False
    user: str | None = None

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def max_tokens_field(self) -> str:
        """The field that limits the new tokens: ``max_completion_tokens`` when given."""
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"

    def completion(self, prompt_token_ids: list[int]) -> CompletionRequest:
        """The ``/v1/completions`` request this one amounts to once its messages are rendered
        to ``prompt_token_ids``: the same sampling fields, seed and limit, the sampled token's
        log-prob (and ``top_logprobs`` alternatives) when ``logprobs``, the token ids always."""
        knobs = self.model_dump(include=set(SamplingKnobs.model_fields), exclude_unset=True)
        limit = self.max_completion_tokens
        return CompletionRequest(
            model=self.model,
            prompt=prompt_token_ids,
            max_tokens=self.max_tokens if limit is None else limit,
            seed=self.seed,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            return_token_ids=True,
            **knobs,
        )


class ChatLogprob(EngineAnswer):
    token: str
    """The token's text, or ``"token_id:<id>"`` with ``return_tokens_as_token_ids``."""
    logprob: float
    bytes: list[int] | None = None
    """The UTF-8 bytes of the token's text."""


class ChatLogprobContent(ChatLogprob):
    top_logprobs: list[ChatLogprob] = Field(default_factory=list)


class ChatLogprobs(EngineAnswer):
    content: list[ChatLogprobContent] | None = None


class ChatMessage(EngineAnswer):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(EngineAnswer):
    index: int = 0
    message: ChatMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    """"stop" | "length" | :data:`ABORTED`."""
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    """vLLM's extension (``return_token_ids``): the generated token ids, a stop token included."""
    weight_versions: list[int] | None = None
    """The embedded engine's extension, as :attr:`CompletionChoice.weight_versions`."""


class ChatCompletionResponse(EngineAnswer):
    id: str = ""
    object: str = "chat.completion"
    created: int = 0
    model: str = ""
    choices: list[ChatChoice]
    usage: CompletionUsage | None = None
    prompt_token_ids: list[int] | None = None
    """vLLM's extension (``return_token_ids``): the rendered prompt's token ids."""
    weight_version: AnsweredVersion = None
    """The embedded engine's extension: the oldest version that sampled any choice."""
