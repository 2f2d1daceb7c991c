"""The built-in ``when`` task: a tool helps on some questions and not on others (the when-to-call
recipe, ``configs/agent_when.yaml``), and questions that need more than one call.

Rows follow the verl layout of :mod:`tasks.products` (``data_source`` ``products``, scored by the
same boxed-answer route); ``extra_info.tier`` names each question's kind:

==============  =====================  ===========================================================
tier            question               what it takes
==============  =====================  ===========================================================
``easy``        ``4821+172=``          a 4-digit plus a 3-digit number without carries (each
                                       answer digit the sum of two): a tiny model answers it in
                                       its head, a call only costs
``hard``        ``4821*372=``          a 4-digit times a 3-digit number (7-digit product): out of
                                       reach without the tool
``two_calls``   ``(482*37)+(519*64)=`` two products summed; the demonstrations make two calls,
                                       ``482*37`` then ``<its value>+519*64``
==============  =====================  ===========================================================

The tiers of a split come in turn (row ``i`` has tier ``tiers[i % len(tiers)]``), so each has the
same share; train and test never share a question. ``easy`` and ``hard`` questions have the same
length, so what a demonstration copies (the question into the call) sits at the same distance in
both: with 3-digit + 1-digit sums (``482+7=``) the tiny model's warm start learned no copy in
1,400 steps (``docs/benchmarks.md``, "When to call").

The warm starts (:func:`demos`; ``up`` writes the ``products`` task's tool demonstrations with it
too): ``tool_calls`` demonstrates the tool on every question, ``half_tool_calls`` on a random
half of them whatever their tier (seeded) and the direct answer on the others, ``answers`` the
direct answers only. A tool demonstration is one supervised row per
model turn, written as :func:`tasks.products.episode_demo` plays it in the ``rollout.env``
environment (the calculator of ``tools``, or a cell printing the expression in
``code_interpreter``). The warm start runs before the services, so a ``code_interpreter``
demonstration's cell runs in :class:`PrintSandbox`, which answers ``print(<arithmetic>)`` with what
the sandbox prints for it (the value and a newline; ``tests/tasks/test_when.py`` checks it against
the reward service's real ``/run_code``).
"""

from __future__ import annotations

import ast
import asyncio
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts.reward import CommandRunResult, RunCodeResponse
from dynamo_rl.prompts import render_raw
from tasks import reference_answer, task_row, write_splits
from tasks.products import DATA_SOURCE, EOS_TEXT, episode_demo, one_call

TIERS = ("easy", "hard", "two_calls")
"""Every tier this task can write (``up.task_tiers``)."""
DEFAULT_TIERS = ("easy", "hard")
"""The when-to-call recipe's mix."""
DEMOS = ("answers", "tool_calls", "half_tool_calls")

_TWO = re.compile(r"^\((\d+)\*(\d+)\)\+\((\d+)\*(\d+)\)=$")


def _question(rng: random.Random, tier: str) -> tuple[str, int]:
    if tier == "easy":
        while True:
            a, b = rng.randint(1000, 9999), rng.randint(100, 999)
            if all(int(x) + int(y) < 10 for x, y in zip(str(a)[1:], str(b), strict=True)):
                return f"{a}+{b}=", a + b
    if tier == "hard":
        while True:
            a, b = rng.randint(1000, 9999), rng.randint(100, 999)
            if len(str(a * b)) == 7:
                return f"{a}*{b}=", a * b
    if tier == "two_calls":
        a, c = rng.randint(100, 999), rng.randint(100, 999)
        b, d = rng.randint(10, 99), rng.randint(10, 99)
        return f"({a}*{b})+({c}*{d})=", a * b + c * d
    raise ValueError(f"up.task_tiers: unknown tier {tier!r}; allowed: {', '.join(TIERS)}")


def generate_rows(
    n_train: int, n_test: int, seed: int = 0, tiers: Sequence[str] = DEFAULT_TIERS
) -> tuple[list[dict], list[dict]]:
    """``n_train`` + ``n_test`` distinct questions, the tiers in turn (the first ``n_test`` drawn
    are the test split), in the verl layout."""
    if not tiers:
        raise ValueError(f"up.task_tiers: at least one of {', '.join(TIERS)}")
    for t in tiers:
        _question(random.Random(0), t)  # an unknown tier fails here, named
    rng = random.Random(seed)
    seen: set[str] = set()
    drawn: list[tuple[str, int, str]] = []
    while len(drawn) < n_train + n_test:
        tier = tiers[len(drawn) % len(tiers)]
        q, v = _question(rng, tier)
        if q not in seen:
            seen.add(q)
            drawn.append((q, v, tier))
    test = [task_row(DATA_SOURCE, q, v, t, "test", i) for i, (q, v, t) in enumerate(drawn[:n_test])]
    train = [
        task_row(DATA_SOURCE, q, v, t, "train", i) for i, (q, v, t) in enumerate(drawn[n_test:])
    ]
    return train, test


def write_task(
    out_dir: str | Path,
    n_train: int = 2000,
    n_test: int = 1000,
    seed: int = 0,
    tiers: Sequence[str] = DEFAULT_TIERS,
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet`` into ``out_dir``; returns their paths."""
    return write_splits(out_dir, *generate_rows(n_train, n_test, seed, tiers))


# --- demonstrations ------------------------------------------------------------------------------


def plan(row: Mapping[str, Any], outputs: list[str]) -> str | None:
    """The calls a demonstration makes for ``row`` (see :data:`tasks.products.Plan`)."""
    question = str(row["prompt"][-1]["content"])
    two = _TWO.match(question)
    if two is None:
        return one_call(row, outputs)
    a, b, c, d = two.groups()
    if not outputs:
        return f"{a}*{b}"
    if len(outputs) == 1:
        return f"{outputs[0]}+{c}*{d}"
    return None


class PrintSandbox:
    """``/run_code`` for the demonstrations' cells only: ``print(<arithmetic>)`` answers the
    value and a newline, as the sandbox prints it; anything else is refused."""

    async def run(self, code: str, *, language: str = "python", run_timeout: float = 10.0):
        from dynamo_rl.envs.builtin import _arith

        found = re.fullmatch(r"print\((.+)\)\n?", code.strip())
        if found is None:
            raise ValueError(f"PrintSandbox runs print(<arithmetic>) cells only, got {code!r}")
        value = _arith(ast.parse(found.group(1), mode="eval"))
        run = CommandRunResult(status="Finished", return_code=0, stdout=f"{value}\n")
        return RunCodeResponse(status="Success", run_result=run)

    async def aclose(self) -> None:
        pass


def answer_demo(env_config: EnvConfig, row: Mapping[str, Any]) -> dict:
    """The direct answer from the environment's first prompt (a turn without a call ends the
    episode)."""
    from dynamo_rl.envs import EnvContext, make_env

    async def first() -> str:
        env = make_env(EnvContext(env_config, None, seed=0))
        try:
            gt = row["reward_model"]["ground_truth"]
            return render_raw(list(await env.reset({**row, "ground_truth": gt})))
        finally:
            await env.aclose()

    prompt = asyncio.run(first())
    answer = reference_answer(int(row["reward_model"]["ground_truth"]))
    return {**row, "prompt": prompt, "extra_info": {**row["extra_info"], "answer": answer}}


def calling_rows(n: int, kind: str, seed: int) -> set[int]:
    """The rows (of ``n``) whose demonstration calls the tool: all (``tool_calls``), none
    (``answers``), or a random half, ``n // 2`` of them, drawn with ``seed`` whatever their tier
    (``half_tool_calls``)."""
    if kind == "tool_calls":
        return set(range(n))
    if kind == "answers":
        return set()
    if kind == "half_tool_calls":
        return set(random.Random(seed).sample(range(n), n // 2))
    raise ValueError(f"up.warm_start.demos: {kind!r}; allowed: {', '.join(DEMOS)}")


def demos(
    rows: Sequence[Mapping[str, Any]],
    env_config: EnvConfig,
    kind: str,
    seed: int = 0,
    eos: str = EOS_TEXT,
) -> list[dict]:
    """The warm start's supervised rows for ``rows``: per question its tool demonstration (one
    row per model turn) or its direct answer (one row), as :func:`calling_rows` picks; each row's
    ``extra_info.called`` says which."""
    from dynamo_rl.envs import check_env_config

    check_env_config(env_config)
    calling = calling_rows(len(rows), kind, seed)
    sandbox = PrintSandbox() if env_config.name == "code_interpreter" else None

    async def tool(row: Mapping[str, Any]) -> list[dict]:
        return await episode_demo(env_config, row, plan, eos, sandbox)

    out: list[dict] = []
    for i, row in enumerate(rows):
        made = asyncio.run(tool(row)) if i in calling else [answer_demo(env_config, row)]
        out += [{**r, "extra_info": {**r["extra_info"], "called": i in calling}} for r in made]
    return out
