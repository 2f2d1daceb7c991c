"""The built-in ``products`` task: multi-digit products a tiny model cannot do in its head, and the
tool-using demonstrations of the agent recipe's warm start (``configs/agent_tools.yaml``).

Every row follows verl's layout, like :mod:`tasks.arith`::

    data_source   "products"
    prompt        [{"role": "user", "content": "4821*372="}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": "1793412"}
    extra_info    {"index": 17, "split": "train", "tier": "4x3", "answer": "\\boxed{1793412}"}

A 4-digit number times a 3-digit one, with a 7-digit product (the tier names the digit counts);
train and test never share a question. ``extra_info.answer`` is the direct answer (the text-only
warm start's target). :func:`tool_demos` turns rows into the tool recipe's warm start: two
supervised rows per question, one per model turn of the episode the recipe plays — the calculator
call, then the final answer after the tool's output — each prompt written exactly as the rollout
loop's token ids will be (``docs/agents.md``, the mask rules), so the warm start and RL see the
same sequences.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.prompts import render_raw
from tasks import task_row, write_splits

DATA_SOURCE = "products"
LEFT_DIGITS = 4
RIGHT_DIGITS = 3
PRODUCT_DIGITS = 7
"""Every question has the same shape (a 4-digit times a 3-digit number, a 7-digit product): the
text a tool-using episode copies (the factors into the call, the tool's output into the answer)
always sits at the same distance, which is what a tiny model learns to copy quickly."""
EOS_TEXT = "<eos>"
"""The tiny model's end-of-text token as text (``learner.tiny_model.EOS``): its tokenizer reads
it back as that one token, so a demonstration's prompt can hold the end of an earlier turn."""


def _question(rng: random.Random) -> tuple[str, int, str]:
    while True:
        a = rng.randint(10 ** (LEFT_DIGITS - 1), 10**LEFT_DIGITS - 1)
        b = rng.randint(10 ** (RIGHT_DIGITS - 1), 10**RIGHT_DIGITS - 1)
        if len(str(a * b)) == PRODUCT_DIGITS:
            return f"{a}*{b}=", a * b, f"{LEFT_DIGITS}x{RIGHT_DIGITS}"


def generate_rows(n_train: int, n_test: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``n_train`` + ``n_test`` distinct questions (the first ``n_test`` drawn are the test
    split), in the verl layout."""
    rng = random.Random(seed)
    seen: set[str] = set()
    drawn: list[tuple[str, int, str]] = []
    while len(drawn) < n_train + n_test:
        q = _question(rng)
        if q[0] not in seen:
            seen.add(q[0])
            drawn.append(q)
    test = [task_row(DATA_SOURCE, q, v, t, "test", i) for i, (q, v, t) in enumerate(drawn[:n_test])]
    train = [
        task_row(DATA_SOURCE, q, v, t, "train", i) for i, (q, v, t) in enumerate(drawn[n_test:])
    ]
    return train, test


def write_task(
    out_dir: str | Path, n_train: int = 3000, n_test: int = 1000, seed: int = 0
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet`` into ``out_dir``; returns their paths."""
    return write_splits(out_dir, *generate_rows(n_train, n_test, seed))


# --- the tool recipe's demonstrations -----------------------------------------------------------


def calculator_call(expression: str) -> str:
    """The Hermes-style call of the ``calculator`` tool the demonstrations write."""
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>{body}</tool_call>"


def call_text(env_config: EnvConfig, expression: str) -> str:
    """How a demonstration asks the environment ``env_config`` for ``expression``'s value: a
    ``calculator`` call (``tools``) or a fenced cell printing it (``code_interpreter``)."""
    if env_config.name == "tools":
        return calculator_call(expression)
    if env_config.name == "code_interpreter":
        return f"```python\nprint({expression})\n```"
    raise ValueError(
        f"rollout.env.name: demonstrations call a tool in 'tools' or 'code_interpreter', "
        f"got {env_config.name!r}"
    )


Plan = Callable[[Mapping[str, Any], list[str]], "str | None"]
"""A demonstration's calls: given the row and the tool outputs so far, the next expression to
ask for, or None to answer."""


def one_call(row: Mapping[str, Any], outputs: list[str]) -> str | None:
    """The products task's plan: the question's expression, once."""
    return None if outputs else str(row["prompt"][-1]["content"]).removesuffix("=")


async def episode_demo(
    env_config: EnvConfig, row: Mapping[str, Any], plan: Plan, eos: str, sandbox: Any = None
) -> list[dict]:
    """One supervised row per model turn of the episode ``plan`` writes in the environment:
    each call from the text kept so far, then the final answer. The prompts are what the rollout
    loop keeps: each sampled turn with its end token, then the observation as the raw template
    renders it after the turn."""
    from dynamo_rl.envs import EnvContext, make_env

    env = make_env(EnvContext(env_config, sandbox, seed=0))
    try:
        messages = list(
            await env.reset({**row, "ground_truth": row["reward_model"]["ground_truth"]})
        )
        plain = kept = render_raw(messages)
        out: list[dict] = []
        outputs: list[str] = []
        while (expression := plan(row, outputs)) is not None:
            call = call_text(env_config, expression)
            out.append({**row, "prompt": kept, "extra_info": {**row["extra_info"], "answer": call}})
            step = await env.step(call)
            calls = (step.info or {}).get("tool_calls", [])
            if step.done or len(calls) != 1 or calls[0].error:
                raise ValueError(
                    f"the environment did not run the demonstration's call {call!r}: {step}"
                )
            messages = [*messages, {"role": "assistant", "content": call}, *step.observation]
            rendered = render_raw(messages)
            kept = kept + call + eos + rendered[len(plain + call) :]
            plain = rendered
            outputs.append(str(step.observation[-1]["content"]).strip())
        answer = row["extra_info"]["answer"]
        return [
            *out,
            {**row, "prompt": kept, "extra_info": {**row["extra_info"], "answer": answer}},
        ]
    finally:
        await env.aclose()


def tool_demos(
    rows: Sequence[Mapping[str, Any]], env_config: EnvConfig, eos: str = EOS_TEXT
) -> list[dict]:
    """Two supervised rows per task row (verl layout, ``prompt`` as text used verbatim): the
    calculator call from the environment's first prompt, then the final answer after the call,
    its end token and the tool's output (which the environment ``env_config`` — a ``tools``
    environment with the ``calculator`` tool and the raw template — really produced)."""

    from dynamo_rl.envs import check_env_config

    check_env_config(env_config)

    async def all_demos() -> list[dict]:
        out: list[dict] = []
        for row in rows:
            out += await episode_demo(env_config, row, one_call, eos)
        return out

    return asyncio.run(all_demos())
