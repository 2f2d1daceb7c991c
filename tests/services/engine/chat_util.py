"""What the chat tests check on any server (the embedded engine, real vLLM): one conversation,
the official ``openai`` client's request, and the reading of its answer, written here once.

The token ids are read from the log-prob entries by this module's own pattern (not the
contract's parser, which the rollout client uses), so the two readings check each other.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 12+7?"},
]
RENDERED = "<|system|>Answer briefly.\n<|user|>What is 12+7?\n<|assistant|>"
"""The conversation through ``engine_util.CHAT_TEMPLATE`` with the generation prompt."""
TOKEN_ID = re.compile(r"token_id:(\d+)")


def chat_kwargs(model: str, *, n: int = 2, seed: int = 7, max_tokens: int = 12) -> dict[str, Any]:
    """``client.chat.completions.create`` arguments: sampled ids and log-probs, vLLM's way."""
    return dict(
        model=model, messages=MESSAGES, n=n, seed=seed, temperature=1.0,
        max_completion_tokens=max_tokens, logprobs=True,
        extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True},
    )  # fmt: skip


@dataclass
class ChatChoice:
    token_ids: list[int]
    logprobs: list[float]
    content: str
    finish_reason: str


def read_chat(out: Any, n: int) -> tuple[list[int], list[ChatChoice]]:
    """The prompt's ids and each choice of an official-client ``ChatCompletion``, checked for
    what every server must give: ``n`` choices in order; ``"token_id:<id>"`` entries, one per
    token, equal to the choice's ``token_ids``; finite log-probs <= 0; usage counting them."""
    assert out.object == "chat.completion"
    assert [c.index for c in out.choices] == list(range(n))
    prompt = (out.model_extra or {})["prompt_token_ids"]
    choices = []
    for c in out.choices:
        assert c.message.role == "assistant"
        entries = c.logprobs.content
        ids = []
        for e in entries:
            match = TOKEN_ID.fullmatch(e.token)
            assert match is not None, e.token
            ids.append(int(match.group(1)))
        assert (c.model_extra or {})["token_ids"] == ids
        lps = [e.logprob for e in entries]
        assert all(math.isfinite(x) and x <= 0.0 for x in lps), lps
        choices.append(ChatChoice(ids, lps, c.message.content or "", c.finish_reason))
    assert out.usage.completion_tokens == sum(len(c.token_ids) for c in choices)
    assert out.usage.prompt_tokens == len(prompt)
    return prompt, choices
