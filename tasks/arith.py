"""The built-in ``arith`` task: integer arithmetic in difficulty tiers, in the verl parquet layout.

DynaMO matters when prompts differ in how much they can still teach, so the task mixes tiers a small
model finds easy (one-digit sums), half-solvable after a short warm start (a two-digit and a
one-digit number added or subtracted), hard (two two-digit numbers) and hopeless (two-digit
products). Every row follows verl's layout::

    data_source   "arith"
    prompt        [{"role": "user", "content": "37+48="}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": "85"}
    extra_info    {"index": 17, "split": "train", "tier": "medium", "answer": "\\boxed{85}"}

``extra_info.answer`` is the reference response (used by the supervised warm start and the
preference-pair generator); responses are scored by the reward service's math verifier, which reads
the last ``\\boxed{...}``. Train and test prompts never share a question.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks import reference_answer, task_row, write_splits

DATA_SOURCE = "arith"


@dataclass(frozen=True)
class Tier:
    name: str
    weight: float
    make: Callable[[random.Random], tuple[str, int]]
    worked: Callable[[str, int], str] | None = None
    """The reference response of a question and its value, when it is more than the boxed
    answer (``tasks.longtail``'s worked sums)."""


def _sum(lo_a: int, hi_a: int, lo_b: int, hi_b: int) -> Callable[[random.Random], tuple[str, int]]:
    def make(rng: random.Random) -> tuple[str, int]:
        a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
        return f"{a}+{b}=", a + b

    return make


def _diff(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(0, 9)
    a, b = max(a, b), min(a, b)
    return f"{a}-{b}=", a - b


def _product(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    return f"{a}*{b}=", a * b


TIERS: tuple[Tier, ...] = (
    Tier("easy", 0.10, _sum(0, 9, 0, 9)),
    Tier("medium", 0.25, _sum(10, 99, 0, 9)),
    Tier("medium-rev", 0.20, _sum(0, 9, 10, 99)),
    Tier("medium-sub", 0.20, _diff),
    Tier("hard", 0.15, _sum(10, 99, 10, 99)),
    Tier("hopeless", 0.10, _product),
)


def generate_rows(
    n_train: int,
    n_test: int,
    seed: int = 0,
    tiers: Sequence[Tier] = TIERS,
    data_source: str = DATA_SOURCE,
) -> tuple[list[dict], list[dict]]:
    """Distinct questions split into train and test rows (verl layout), from ``tiers`` (the
    arithmetic task's by default).

    Questions are drawn tier by tier in proportion to the tier weights (a tier whose distinct
    questions run out, such as the 100 one-digit sums, drops out and the others fill its share),
    and each tier is split train/test in the same proportion, so both splits hold the same mix.
    """
    rng = random.Random(seed)
    total = n_train + n_test
    test_fraction = n_test / total
    train: list[dict] = []
    test: list[dict] = []
    drawn: dict[str, list[tuple[str, int]]] = {t.name: [] for t in tiers}
    open_tiers = list(tiers)
    seen: set[str] = set()
    count = 0
    while count < total and open_tiers:
        tier = rng.choices(open_tiers, [t.weight for t in open_tiers])[0]
        for _ in range(200):  # a tier that keeps repeating itself is exhausted
            question, value = tier.make(rng)
            if question not in seen:
                seen.add(question)
                drawn[tier.name].append((question, value))
                count += 1
                break
        else:
            open_tiers.remove(tier)
    # Test rows per tier by largest remainder, so the split sizes are exact.
    exact = {t.name: len(drawn[t.name]) * test_fraction for t in tiers}
    k_test = {name: int(x) for name, x in exact.items()}
    by_remainder = sorted(exact, key=lambda name: exact[name] - k_test[name], reverse=True)
    for name in by_remainder[: max(0, min(n_test, count) - sum(k_test.values()))]:
        k_test[name] += 1
    for tier in tiers:
        rows = drawn[tier.name]
        k = k_test[tier.name]
        test += [{"tier": tier.name, "q": q, "v": v} for q, v in rows[:k]]
        train += [{"tier": tier.name, "q": q, "v": v} for q, v in rows[k:]]
    if not train or not test:
        raise ValueError(f"cannot draw {n_train} train and {n_test} test questions")
    rng.shuffle(train)
    rng.shuffle(test)
    worked = {t.name: t.worked for t in tiers if t.worked is not None}

    def row(r: dict, split: str, i: int) -> dict:
        out = task_row(data_source, r["q"], r["v"], r["tier"], split, i)
        if r["tier"] in worked:
            out["extra_info"]["answer"] = worked[r["tier"]](r["q"], r["v"])
        return out

    return (
        [row(r, "train", i) for i, r in enumerate(train[:n_train])],
        [row(r, "test", i) for i, r in enumerate(test[:n_test])],
    )


def check_split(rows: list[dict], tiers: list[str], per_tier: int) -> tuple[list[dict], list[dict]]:
    """(warm-start rows, check rows) of ``rows`` restricted to ``tiers``: the first ``per_tier``
    rows of each tier (rows are shuffled when drawn) are held out to check the warm start on
    questions it never saw; a tier keeps at least half of its rows for the warm start."""
    train: list[dict] = []
    check: list[dict] = []
    taken = dict.fromkeys(tiers, 0)
    sizes = {t: sum(1 for r in rows if r["extra_info"]["tier"] == t) for t in tiers}
    for row in rows:
        tier = row["extra_info"]["tier"]
        if tier not in taken:
            continue
        if taken[tier] < min(per_tier, sizes[tier] // 2):
            taken[tier] += 1
            check.append(row)
        else:
            train.append(row)
    return train, check


def focus_mix(rows: list[dict], focus: list[str], share: float, seed: int = 0) -> list[dict]:
    """Every row of ``rows`` once, plus the rows of the ``focus`` tiers repeated (in a seeded
    order) until they make up ``share`` of the result: a warm-start extension that spends that
    share of each batch on the tiers not yet learned without forgetting the others."""
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1), got {share}")
    inside = [r for r in rows if r["extra_info"]["tier"] in focus]
    outside = [r for r in rows if r["extra_info"]["tier"] not in focus]
    if not inside:
        raise ValueError(f"no rows of the tiers {', '.join(focus)}")
    if not outside:
        return list(inside)
    want = max(len(inside), round(share * len(outside) / (1 - share)))
    rng = random.Random(seed)
    extra: list[dict] = []
    while len(inside) + len(extra) < want:
        pool = list(inside)
        rng.shuffle(pool)
        extra += pool[: want - len(inside) - len(extra)]
    return outside + inside + extra


def write_task(
    out_dir: str | Path, n_train: int = 4000, n_test: int = 1000, seed: int = 0
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet`` into ``out_dir``; returns their paths."""
    return write_splits(out_dir, *generate_rows(n_train, n_test, seed))


# --- preference pairs (the learner's dpo mode) ------------------------------------------------


WRONG_KINDS = ("random", "units")


def wrong_answer(value: int, rng: random.Random, kind: str = "random") -> int:
    """A wrong answer to a question whose answer is ``value``, with as many digits.

    ``random``: any other number of that length (the pair tells apart answers of the right size
    from wrong ones — what a small model learns first); ``units``: only the units digit is wrong,
    so chosen and rejected share every token but one and telling them apart is exactly the
    arithmetic the operands' units digits decide (much harder for a small model)."""
    if kind not in WRONG_KINDS:
        raise ValueError(f"wrong-answer kind must be one of {', '.join(WRONG_KINDS)}, got {kind!r}")
    sign = -1 if value < 0 else 1
    magnitude = abs(value)
    digits = len(str(magnitude))
    lo, hi = (0, 9) if digits == 1 else (10 ** (digits - 1), 10**digits - 1)
    while True:
        if kind == "units":
            wrong = magnitude - magnitude % 10 + (magnitude % 10 + rng.randint(1, 9)) % 10
        else:
            wrong = rng.randint(lo, hi)
        if wrong != magnitude and not (sign < 0 and wrong == 0):  # keep the sign visible
            return sign * wrong


def preference_rows(
    rows: list[dict], seed: int = 0, pairs_per_prompt: int = 1, kind: str = "random"
) -> list[dict]:
    """Preference pairs (TRL-style ``prompt``, ``chosen``, ``rejected``) from task rows: the
    reference answer against wrong answers (distinct ones when several per prompt; see
    :func:`wrong_answer` for ``kind``)."""
    rng = random.Random(seed)
    out = []
    for row in rows:
        value = int(row["reward_model"]["ground_truth"])
        wrongs: list[int] = []
        while len(wrongs) < min(pairs_per_prompt, 9):
            w = wrong_answer(value, rng, kind)
            if w not in wrongs:
                wrongs.append(w)
        for w in wrongs:
            out.append(
                {
                    "data_source": DATA_SOURCE,
                    "prompt": row["prompt"],
                    "chosen": reference_answer(value),
                    "rejected": reference_answer(w),
                    "extra_info": dict(row["extra_info"]),
                }
            )
    return out


def write_preferences(
    out_dir: str | Path,
    n_train: int = 4000,
    n_test: int = 1000,
    seed: int = 0,
    tiers: list[str] | None = None,
    pairs_per_prompt: int = 1,
    kind: str = "random",
) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``test.jsonl`` preference pairs (held-out prompts in test) for
    the learner's dpo mode; ``tiers`` keeps only those tiers."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, test = generate_rows(n_train, n_test, seed)
    paths = {}
    for i, (name, rows) in enumerate((("train", train), ("test", test))):
        if tiers is not None:
            rows = [r for r in rows if r["extra_info"]["tier"] in tiers]
        pairs = preference_rows(rows, seed * 2 + i, pairs_per_prompt, kind)
        path = out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
        paths[name] = path
    return paths
