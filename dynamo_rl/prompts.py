"""How a prompt becomes text: one rendering for rollout, evaluation and supervised training.

A prompt is either raw text (used verbatim: the dataset chose its format) or chat messages. Chat
messages go through the tokenizer's chat template when it has one (``template="chat"``, or
``"auto"``), else through the plain template — ``Role: content`` lines ending in ``Assistant:`` —
so that a model warm-started on this text sees exactly what the rollout worker later sends.
``template="raw"`` uses the messages' contents alone (one per line) — a base model's completion
prompt, as toy tasks such as the built-in ``arith`` use. The tokenizer is passed in; this module
imports no tokenizer library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Messages = Sequence[Mapping[str, str]]
TEMPLATES = ("auto", "chat", "plain", "raw")


def render_raw(messages: Messages) -> str:
    """The messages' contents alone, one per line: a base model's completion prompt. An
    assistant message is written right after the message before it, where generation continued,
    so a model turn extends the text it was sampled from (multi-turn episodes, their demos)."""
    text = ""
    for i, m in enumerate(messages):
        sep = "" if m["role"] == "assistant" or not i else "\n"
        text += sep + m["content"]
    return text


def render_plain(messages: Messages) -> str:
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join([*lines, "Assistant:"])


def uses_chat_template(tokenizer: Any, template: str) -> bool:
    """Whether ``template`` means the tokenizer's chat template (ValueError when impossible)."""
    if template not in TEMPLATES:
        raise ValueError(f"prompt template must be one of {', '.join(TEMPLATES)}, got {template!r}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if template == "chat" and not has_template:
        raise ValueError("prompt template is 'chat' but the tokenizer has no chat template")
    return template == "chat" or (template == "auto" and has_template)


def render_prompt(
    tokenizer: Any, prompt: str | Messages, template: str = "auto"
) -> tuple[str, list[int]]:
    """``(text, token ids)`` of a prompt, ready for generation."""
    if isinstance(prompt, str):
        return prompt, list(tokenizer.encode(prompt, add_special_tokens=True))
    if template == "raw":
        text = render_raw(prompt)
        return text, list(tokenizer.encode(text, add_special_tokens=True))
    if uses_chat_template(tokenizer, template):
        text = tokenizer.apply_chat_template(
            list(prompt), tokenize=False, add_generation_prompt=True
        )
        # The template already wrote any BOS; adding special tokens would double it.
        return text, list(tokenizer.encode(text, add_special_tokens=False))
    text = render_plain(prompt)
    return text, list(tokenizer.encode(text, add_special_tokens=True))
