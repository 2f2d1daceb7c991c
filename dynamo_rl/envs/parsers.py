"""Tool-call parsers by name (``rollout.env.tool_parser``) and the code-block parser.

A parser turns a model turn's text into the tool calls it makes and the malformed attempts it
contains; it never raises on bad model output (a malformed call becomes an error observation).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TOOL_PARSERS", "ParsedCalls", "ToolCall", "parse_code_blocks", "register_parser"]


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    raw: str


@dataclass
class ParsedCalls:
    calls: list[ToolCall] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    """One reason per call that could not be parsed."""


Parser = Callable[[str], ParsedCalls]
TOOL_PARSERS: dict[str, Parser] = {}


def register_parser(name: str) -> Callable[[Parser], Parser]:
    def deco(fn: Parser) -> Parser:
        TOOL_PARSERS[name] = fn
        return fn

    return deco


_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@register_parser("hermes")
def parse_hermes(text: str) -> ParsedCalls:
    """Hermes/Qwen calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; an
    unclosed tag, a body that is not a JSON object, a missing ``name`` or non-object
    ``arguments`` (a JSON string holding an object is accepted, as Qwen sometimes writes) are
    malformed."""
    out = ParsedCalls()
    for m in _HERMES.finditer(text):
        body, close = m.group(1).strip(), m.group(2)
        if not close:
            out.malformed.append("unclosed <tool_call>")
            continue
        try:
            obj = json.loads(body)
        except ValueError as e:
            out.malformed.append(f"tool call is not JSON: {e}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            out.malformed.append('tool call needs a JSON object with a string "name"')
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            with contextlib.suppress(ValueError):
                args = json.loads(args)
        if not isinstance(args, dict):
            out.malformed.append('tool call "arguments" must be a JSON object')
            continue
        out.calls.append(ToolCall(obj["name"], args, body))
    return out


_FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(```|$)", re.DOTALL)


def parse_code_blocks(text: str) -> ParsedCalls:
    """Fenced ```python blocks as calls of ``python`` (``arguments = {"code": ...}``); a block
    with no closing fence is malformed."""
    out = ParsedCalls()
    for m in _FENCE.finditer(text):
        code, close = m.group(1), m.group(2)
        if not close:
            out.malformed.append("unclosed ```python block")
            continue
        out.calls.append(ToolCall("python", {"code": code}, code))
    return out
