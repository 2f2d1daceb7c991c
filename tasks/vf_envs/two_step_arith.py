"""A two-turn arithmetic environment in verifiers' own API (``vf.MultiTurnEnv``), over sums
generated locally from a seed (nothing downloaded): the recipe of
``configs/verifiers_multi_turn.yaml``.

Turn 1: the row asks ``What is a+b?``. The environment then answers with feedback and a second
question that carries the true sum forward whatever the model said (``Right.`` or ``No, it is
s.``, then ``What is s+c?``), so the second turn can be learned on its own. Reward: half a point
per turn whose reply's first integer is the right sum (0, 0.5 or 1). The row's ``answer`` is the
first turn's sum (what ``up``'s warm start trains as the reply to the row's prompt), ``info``
holds ``add`` (c) and ``total`` (s+c).

``load_environment(train, test, seed, digits)``: ``train`` rows as the training ``dataset``,
``test`` others as ``eval_dataset``; operands of up to ``digits`` digits.
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

SYSTEM = "Answer with the number only."
_INT = re.compile(r"-?\d+")


def first_int(text: str | None) -> int | None:
    """The first integer in a reply (None: none)."""
    m = _INT.search(text or "")
    return int(m.group()) if m else None


def rows(n: int, rng: random.Random, digits: int) -> list[dict]:
    top = 10**digits - 1
    out = []
    for _ in range(n):
        a, b, c = rng.randint(0, top), rng.randint(0, top), rng.randint(0, top)
        out.append({
            "question": f"What is {a}+{b}?",
            "answer": str(a + b),
            "info": {"add": c, "total": a + b + c},
        })  # fmt: skip
    return out


def replies(completion) -> list[str]:
    """The model's turns' texts, in order."""
    return [str(m["content"] or "") for m in completion if m["role"] == "assistant"]


class TwoStepArith(vf.MultiTurnEnv):
    """Feedback on the first sum, then one more addition."""

    async def env_response(self, messages, state, **kwargs):
        said = first_int(replies(messages)[-1] if replies(messages) else "")
        s = int(state["answer"])
        feedback = "Right." if said == s else f"No, it is {s}."
        return [vf.UserMessage(content=f"{feedback} What is {s}+{state['info']['add']}?")]


def load_environment(train: int = 2000, test: int = 200, seed: int = 0, digits: int = 1):
    rng = random.Random(seed)
    train_rows, test_rows = rows(train, rng, digits), rows(test, rng, digits)

    def first_sum(completion, answer, **kwargs) -> float:
        said = replies(completion)
        return float(bool(said) and first_int(said[0]) == int(answer))

    def second_sum(completion, info, **kwargs) -> float:
        said = replies(completion)
        return float(len(said) > 1 and first_int(said[1]) == int(info["total"]))

    return TwoStepArith(
        dataset=Dataset.from_list(train_rows),
        eval_dataset=Dataset.from_list(test_rows),
        system_prompt=SYSTEM,
        rubric=vf.Rubric(funcs=[first_sum, second_sum], weights=[0.5, 0.5]),
        max_turns=2,
    )
