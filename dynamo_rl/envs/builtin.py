"""The built-in environments: ``single_turn``, ``guess_number``, ``code_interpreter``, ``tools``."""

from __future__ import annotations

import ast
import json
import operator
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dynamo_rl.envs.base import EnvContext, Environment, Message, Step, ToolCallRecord, register_env
from dynamo_rl.envs.parsers import TOOL_PARSERS, ParsedCalls, parse_code_blocks

__all__ = ["TOOL_FUNCTIONS", "register_tool", "row_messages", "truncate"]


def row_messages(row: Mapping[str, Any]) -> list[Message]:
    """A row's prompt as chat messages (text becomes one user message)."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def truncate(text: str, budget: int) -> str:
    """``text`` cut to ``budget`` characters, head and tail kept, the cut named."""
    if len(text) <= budget:
        return text
    marker = f"\n...[{len(text) - budget} characters truncated]...\n"
    keep = max(0, budget - len(marker))
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head) :]


def _with_system(messages: list[Message], system: str | None) -> list[Message]:
    if not system:
        return messages
    if messages and messages[0]["role"] == "system":
        return [
            {"role": "system", "content": f"{system}\n\n{messages[0]['content']}"},
            *messages[1:],
        ]
    return [{"role": "system", "content": system}, *messages]


@register_env("single_turn")
class SingleTurn(Environment):
    """One prompt, one response: the rollouts of a plain RL run (``multi_turn = False``: the row's
    prompt as rendered, the engine's sample as the response)."""

    multi_turn = False

    def __init__(self, ctx: EnvContext) -> None:
        self.ctx = ctx

    async def reset(self, row: Mapping[str, Any]) -> list[Message]:
        return row_messages(row)

    async def step(self, turn: str) -> Step:
        return Step([], None, True, {})


_INT = re.compile(r"-?\d+")


@register_env("guess_number")
class GuessNumber(Environment):
    """Guess a secret integer in ``[guess_low, guess_high]`` with higher/lower feedback.

    The secret is the row's ``ground_truth`` when it is an integer, else drawn from the episode's
    seed. Each turn's last integer is the guess; a turn without one gets a reminder. The winning
    turn has reward 1 and ends the episode (the reward service's math scorer, scoring the final
    turn against the same ground truth, gives the outcome); a wrong guess has reward 0.
    """

    def __init__(self, ctx: EnvContext) -> None:
        self.cfg = ctx.config
        self.rng = random.Random(ctx.seed)
        self.secret = 0

    async def reset(self, row: Mapping[str, Any]) -> list[Message]:
        lo, hi = self.cfg.guess_low, self.cfg.guess_high
        try:
            self.secret = int(str(row.get("ground_truth", "")).strip())
        except ValueError:
            self.secret = self.rng.randint(lo, hi)
        text = f"Guess my number between {lo} and {hi}. Answer with one number."
        return [{"role": "user", "content": text}]

    async def step(self, turn: str) -> Step:
        found = _INT.findall(turn)
        if not found:
            return Step([{"role": "user", "content": "Answer with one number."}], 0.0, False, {})
        guess = int(found[-1])
        if guess == self.secret:
            return Step([], 1.0, True, {"guess": guess})
        hint = "higher" if guess < self.secret else "lower"
        return Step([{"role": "user", "content": f"{guess} is wrong: {hint}."}], 0.0, False,
                    {"guess": guess})  # fmt: skip


# -- code interpreter ----------------------------------------------------------------------------


async def _run_cell(ctx: EnvContext, code: str) -> tuple[str, str]:
    """Run a cell in the sandbox: (observation text, error or "")."""
    if ctx.sandbox is None:
        raise RuntimeError("no sandbox: set rollout.env.sandbox_url or endpoints.reward_url")
    cfg = ctx.config
    reply = await ctx.sandbox.run(code, run_timeout=cfg.tool_timeout_s)
    run = reply.run_result
    out = (run.stdout if run else "") + (run.stderr if run else "")
    if reply.compile_result is not None and reply.compile_result.stderr:
        out = reply.compile_result.stderr + out
    error = ""
    if reply.status != "Success":
        error = "timeout" if run is not None and run.status == "TimeLimitExceeded" else "failed"
    return truncate(out or reply.message, cfg.observation_max_chars), error


def _stateful(cells: list[str], code: str) -> str:
    """Earlier cells re-run silently (stdout discarded) before ``code``: state across cells."""
    prelude = ["import contextlib as _dc, io as _dio"]
    for cell in cells:
        prelude.append(
            "with _dc.redirect_stdout(_dio.StringIO()):\n"
            f"    exec(compile({cell!r}, '<cell>', 'exec'), globals())"
        )
    return "\n".join([*prelude, code])


@register_env("code_interpreter")
class CodeInterpreter(Environment):
    """The model writes fenced ```python blocks; each runs in the sandbox (``/run_code``) and its
    stdout/stderr, truncated to ``observation_max_chars``, comes back as a ``tool`` message. A
    turn without a block is the final answer (done). With ``stateful_cells`` the earlier cells
    that ran are re-run silently first (ReTool/SimpleTIR style)."""

    SYSTEM = (
        "You may run Python: write a ```python code block and its output will be returned. "
        "Give the final answer without a code block."
    )

    def __init__(self, ctx: EnvContext) -> None:
        self.ctx = ctx
        self.cells: list[str] = []

    async def reset(self, row: Mapping[str, Any]) -> list[Message]:
        system = self.ctx.config.system_prompt
        return _with_system(row_messages(row), self.SYSTEM if system is None else system)

    async def step(self, turn: str) -> Step:
        parsed = parse_code_blocks(turn)
        if not parsed.calls and not parsed.malformed:
            return Step([], None, True, {})
        return await _answer(self.ctx, parsed, self._call)

    async def _call(self, name: str, args: dict[str, Any]) -> tuple[str, str]:
        code = str(args["code"])
        full = _stateful(self.cells, code) if self.ctx.config.stateful_cells else code
        text, error = await _run_cell(self.ctx, full)
        if not error:
            self.cells.append(code)
        return text, error


async def _answer(
    ctx: EnvContext,
    parsed: ParsedCalls,
    call: Callable[[str, dict[str, Any]], Awaitable[tuple[str, str]]],
) -> Step:
    """Run a turn's calls in order; one ``tool`` message per call and per malformed call."""
    obs: list[Message] = []
    records: list[ToolCallRecord] = []
    for reason in parsed.malformed:
        records.append(ToolCallRecord("", "", f"malformed: {reason}", 0.0, malformed=True))
        obs.append({"role": "tool", "content": f"error: malformed tool call: {reason}"})
    for c in parsed.calls:
        t0 = time.monotonic()
        text, error = await call(c.name, c.arguments)
        records.append(
            ToolCallRecord(c.name, json.dumps(c.arguments), error, time.monotonic() - t0)
        )
        obs.append({"role": "tool", "content": text if not error or text else f"error: {error}"})
    return Step(obs, None, False, {"tool_calls": records})


# -- function tools ------------------------------------------------------------------------------

ToolFn = Callable[[EnvContext, dict[str, Any]], Awaitable[str]]
TOOL_FUNCTIONS: dict[str, ToolFn] = {}
"""Implementations of function tools by name; ``rollout.env.tools`` declares their schemas."""


def register_tool(name: str) -> Callable[[ToolFn], ToolFn]:
    def deco(fn: ToolFn) -> ToolFn:
        TOOL_FUNCTIONS[name] = fn
        return fn

    return deco


_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
}  # fmt: skip


def _arith(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        if isinstance(node.op, ast.Pow) and abs(_arith(node.right)) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


@register_tool("calculator")
async def calculator(ctx: EnvContext, args: dict[str, Any]) -> str:
    """``{"expression": "12*34"}`` -> the value (integers and + - * / // % **, no names)."""
    return str(_arith(ast.parse(str(args["expression"]), mode="eval")))


@register_tool("python")
async def python_tool(ctx: EnvContext, args: dict[str, Any]) -> str:
    """``{"code": "..."}`` -> stdout/stderr of one sandbox run."""
    text, error = await _run_cell(ctx, str(args["code"]))
    if error:
        raise RuntimeError(f"{error}: {text}")
    return text


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (dict,), "array": (list,),
}  # fmt: skip


def check_arguments(schema: Mapping[str, Any], args: dict[str, Any]) -> str:
    """Why ``args`` do not fit a function's ``parameters`` schema (required keys, top-level
    types, no unknown keys when ``additionalProperties`` is false); "" when they do."""
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        return f"missing required argument(s) {missing}"
    for k, v in args.items():
        if k not in props:
            if schema.get("additionalProperties", True) is False:
                return f"unknown argument {k!r}; allowed: {sorted(props)}"
            continue
        kind = props[k].get("type")
        types = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
        if types and (not isinstance(v, types) or (kind != "boolean" and isinstance(v, bool))):
            return f"argument {k!r} must be {kind}, got {type(v).__name__}"
    return ""


@register_env("tools")
class Tools(Environment):
    """OpenAI-style function tools (``rollout.env.tools``: ``{"type": "function", "function":
    {name, description, parameters}}`` schemas, implemented by :data:`TOOL_FUNCTIONS`), called
    as ``rollout.env.tool_parser`` parses them. A turn without a call ends the episode."""

    def __init__(self, ctx: EnvContext) -> None:
        self.ctx = ctx
        self.parser = TOOL_PARSERS[ctx.config.tool_parser]
        self.schemas = {t["function"]["name"]: t["function"] for t in ctx.config.tools}

    async def reset(self, row: Mapping[str, Any]) -> list[Message]:
        listing = "\n".join(json.dumps(t) for t in self.ctx.config.tools)
        system = self.ctx.config.system_prompt or (
            "You can call these tools:\n" + listing + '\nCall one as <tool_call>{"name": ..., '
            '"arguments": {...}}</tool_call>. Give the final answer without a tool call.'
        )
        return _with_system(row_messages(row), system)

    async def step(self, turn: str) -> Step:
        parsed = self.parser(turn)
        if not parsed.calls and not parsed.malformed:
            return Step([], None, True, {})
        return await _answer(self.ctx, parsed, self._call)

    async def _call(self, name: str, args: dict[str, Any]) -> tuple[str, str]:
        schema = self.schemas.get(name)
        if schema is None:
            return "", f"unknown tool {name!r}; tools: {sorted(self.schemas)}"
        bad = check_arguments(schema.get("parameters", {}), args)
        if bad:
            return "", f"bad arguments: {bad}"
        try:
            out = await TOOL_FUNCTIONS[name](self.ctx, args)
        except Exception as e:  # a tool's failure is the model's observation, not a crash
            return truncate(f"error: {e}", self.ctx.config.observation_max_chars), "failed"
        return truncate(out, self.ctx.config.observation_max_chars), ""
