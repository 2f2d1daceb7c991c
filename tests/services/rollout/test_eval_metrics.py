"""avg@k, the unbiased pass@k, maj@k and the bootstrap intervals of ``services.rollout.eval_metrics``."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.rollout.eval_metrics import (
    PromptOutcome,
    format_table,
    majority_correct,
    normalise_answer,
    pass_at_k,
    summarize,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, Fraction(7, 10)),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 1, 2, Fraction(1, 2)),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (10, 3, 1, Fraction(3, 10)),  # pass@1 = c/n
        (16, 4, 8, Fraction(12870 - 495, 12870)),  # 1 - C(12,8)/C(16,8)
        (3, 1, 3, Fraction(1)),  # n - c < k: some draw must hold the correct one
        (4, 0, 2, Fraction(0)),
        (4, 4, 1, Fraction(1)),
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: Fraction) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12)


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n),
                                                      st.integers(1, n))))  # fmt: skip
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(
    nck: tuple[int, int, int],
) -> None:
    n, c, k = nck
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    share = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(share, abs=1e-12)


def test_pass_at_k_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="1 <= k <= samples"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= correct"):
        pass_at_k(4, 5, 1)


def test_majority_vote_normalises_answers_and_skips_samples_without_one() -> None:
    # "3" four times (as "$3$", " 3", "3.0", "3"), "2" three times: 3 wins though 2 came first.
    answers = ["2", "$3$", "2.0", " 3", None, None, None, "3.0", "2", "3"]
    correct = [True, False, True, False, False, False, False, False, True, False]
    assert majority_correct(answers, correct) is False
    # A tie goes to the answer that reached the top count first.
    assert majority_correct(["7", "8", "7", "8"], [True, False, True, False]) is True
    assert majority_correct(["7", "8", "8", "7"], [True, False, False, True]) is False
    assert majority_correct([None, None], [False, False]) is None
    assert normalise_answer("\\left( 3, \\frac{\\pi}{2} \\right)") == "(3,\\frac{\\pi}{2})"
    assert normalise_answer("1,000") == normalise_answer("1000.00") == "1000"


def test_summarize_means_and_columns() -> None:
    outcomes = [
        PromptOutcome([True, False, False, False], ["1", "2", "2", None]),
        PromptOutcome([True, True, True, False], ["5", "5", "5", "6"]),
        PromptOutcome([False, False, False, False], [None, None, None, None]),
    ]
    got = summarize(outcomes, ks=[1, 2, 4], resamples=200, seed=1)
    m = got["metrics"]
    assert got["prompts"] == 3 and got["n"] == 4
    assert m["avg@4"]["mean"] == pytest.approx((1 / 4 + 3 / 4 + 0) / 3)
    assert m["pass@1"]["mean"] == pytest.approx(m["avg@4"]["mean"])
    assert m["pass@2"]["mean"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)  # 1-C(3,2)/C(4,2) = 1/2
    assert m["pass@4"]["mean"] == pytest.approx(2 / 3)
    assert m["maj@4"]["mean"] == pytest.approx(1 / 3)  # "2" wins prompt 1 (wrong), "5" prompt 2
    code = summarize([PromptOutcome([True, False])], resamples=0)
    assert code["metrics"]["maj@2"] is None and set(code["metrics"]) == {"avg@2", "pass@1",
                                                                        "pass@2", "maj@2"}  # fmt: skip
    with pytest.raises(ValueError, match="same number"):
        summarize([PromptOutcome([True]), PromptOutcome([True, False])])
    with pytest.raises(ValueError, match=r"every k must be in 1\.\.2"):
        summarize([PromptOutcome([True, False])], ks=[3])


def test_bootstrap_interval_is_seeded_and_brackets_the_spread() -> None:
    # Two prompts, 0 and 1: a resample's mean is 0, 1/2 or 1 (1/4, 1/2, 1/4): the 95% interval
    # runs from 0 to 1.
    two = [PromptOutcome([False]), PromptOutcome([True])]
    assert summarize(two, resamples=4000, seed=0)["metrics"]["avg@1"]["ci"] == [0.0, 1.0]
    # All correct: no spread at all.
    assert summarize([PromptOutcome([True])] * 5, seed=0)["metrics"]["avg@1"]["ci"] == [1.0, 1.0]
    # 200 prompts at 30%: the interval holds the mean, is about ±2 standard errors wide, and the
    # same seed gives the same interval, another seed another one.
    many = [PromptOutcome([i % 10 < 3]) for i in range(200)]
    a = summarize(many, seed=3)["metrics"]["avg@1"]
    lo, hi = a["ci"]
    assert lo < 0.3 < hi
    se = (0.3 * 0.7 / 200) ** 0.5
    assert 3.0 * se < hi - lo < 5.0 * se
    assert summarize(many, seed=3)["metrics"]["avg@1"]["ci"] == a["ci"]
    assert summarize(many, seed=4)["metrics"]["avg@1"]["ci"] != a["ci"]


def test_table_has_a_row_per_benchmark() -> None:
    a = summarize([PromptOutcome([True, False], ["1", "2"])], resamples=10)
    b = summarize([PromptOutcome([True, True])], resamples=10)
    table = format_table({"gsm8k": a, "apps": b}).splitlines()
    assert table[0].split() == ["benchmark", "prompts", "avg@2", "pass@1", "pass@2", "maj@2"]
    assert table[2].startswith("gsm8k") and "50.0 [50.0, 50.0]" in table[2]
    assert table[3].startswith("apps") and table[3].rstrip().endswith("-")
