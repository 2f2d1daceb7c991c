"""The built-in ``longtail`` task: integer sums whose reference responses differ more than tenfold
in length, for comparing waiting and interruptible weight updates (``rollout.update_mode``,
``benchmarks/longtail_updates.py``).

Most questions are short (a two-digit plus a one-digit number, answered with the boxed sum
alone); a fifth are chains of :data:`CHAIN_TERMS` one-digit numbers, answered with the running sum
worked out term by term before the boxed total::

    short   "37+5="            ->  "\\boxed{42}"                                   (11 tokens)
    long    "3+5+2+...+4="     ->  "3+5=8 8+2=10 10+... 71+4=75 \\boxed{75}"     (~128 tokens)

(token counts with the tiny model's byte tokenizer, end of text included). The short tier has 900
distinct questions, so a task of more than 1,125 (train + test) holds more than a fifth long ones:
the generator fills an exhausted tier's share with the other's. A model warm-started on
these references answers long questions at length, so the responses of one batch have a long
tail. Rows follow the arithmetic task's verl layout (:mod:`tasks.arith`); ``extra_info.answer``
holds the worked reference; the reward service's math verifier reads the last ``\\boxed{...}``.
"""

from __future__ import annotations

import random
from pathlib import Path

from tasks import reference_answer, write_splits
from tasks.arith import Tier, generate_rows

DATA_SOURCE = "longtail"
CHAIN_TERMS = 16
"""Terms of a long question."""


def _short(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(0, 9)
    return f"{a}+{b}=", a + b


def _chain(rng: random.Random) -> tuple[str, int]:
    terms = [rng.randint(1, 9) for _ in range(CHAIN_TERMS)]
    return "+".join(map(str, terms)) + "=", sum(terms)


def worked_sum(question: str, value: int) -> str:
    """The running sum of a chain, one step per term, then the boxed total."""
    terms = [int(t) for t in question.rstrip("=").split("+")]
    steps, total = [], terms[0]
    for t in terms[1:]:
        steps.append(f"{total}+{t}={total + t}")
        total += t
    assert total == value
    return " ".join(steps) + " " + reference_answer(value)


TIERS: tuple[Tier, ...] = (
    Tier("short", 0.8, _short),
    Tier("long", 0.2, _chain, worked=worked_sum),
)


def write_task(
    out_dir: str | Path, n_train: int = 3000, n_test: int = 500, seed: int = 0
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet`` into ``out_dir``; returns their paths."""
    rows = generate_rows(n_train, n_test, seed, tiers=TIERS, data_source=DATA_SOURCE)
    return write_splits(out_dir, *rows)
