"""The engine's sampler (``services/engine/sampler.py``) on logits built by hand: greedy rows take
the argmax, top-k keeps exactly k tokens and top-p the smallest head reaching p, the reported
log-probs are the distribution the token was drawn from (or the model's, ``raw``), draws follow
that distribution, and a seeded row draws the same tokens whatever shares its batch.

Token ids are compared exactly; log-probs within 1e-6 (float32 of the same formula), sampled
frequencies within 0.015 of the probabilities (20 000 draws: over four standard deviations)."""

from __future__ import annotations

import math

import pytest
import torch

from dynamo_rl.contracts.sampling import SamplingParams
from services.engine.sampler import (
    MASKED_LOGPROB,
    filter_logits,
    row_generator,
    sample,
    sample_seed,
    top_alternatives,
)

TOL = 1e-6


def row(temperature: float = 1.0, top_p: float = 1.0, top_k: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)


def _rng(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _logits(n: int, vocab: int = 50, seed: int = 1) -> torch.Tensor:
    return torch.randn((n, vocab), generator=_rng(seed)) * 3


def _draw(logits: torch.Tensor, rows: list[SamplingParams], mode: str = "processed", seed: int = 0):
    return sample(logits, rows, [None] * len(rows), _rng(seed), mode)


def _kept(logprobs: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logprobs).nonzero()[:, 0].tolist())


def test_greedy_rows_take_the_argmax_and_report_raw_logprobs() -> None:
    logits = _logits(4)
    want = logits.argmax(-1)
    assert want.tolist() != [0, 0, 0, 0]
    raw = torch.log_softmax(logits, -1)
    draw = _draw(logits, [row(0.0)] * 4)
    assert draw.tokens.tolist() == want.tolist()
    assert torch.allclose(draw.token_logprobs, raw.gather(1, want[:, None])[:, 0], atol=TOL)
    # Mixed with sampled rows (top-k 2 at temperature 5), greedy rows still take the argmax and
    # report the raw distribution, in processed mode too (their own top-k left out).
    rows = [row(0.0, top_k=2), row(5.0, top_k=2), row(0.0, top_p=0.1), row(5.0, top_k=2)]
    for seed in range(5):
        draw = _draw(logits, rows, seed=seed)
        assert draw.tokens[[0, 2]].tolist() == want[[0, 2]].tolist()
        assert torch.allclose(draw.logprobs[[0, 2]], raw[[0, 2]], atol=TOL)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k_keeps_exactly_the_k_most_likely(k: int) -> None:
    logits = _logits(2)
    draw = _draw(logits, [row(1.0, top_k=k), row(1.0)])
    top = set(torch.topk(logits[0], k).indices.tolist())
    assert _kept(draw.logprobs[0]) == top
    assert _kept(draw.logprobs[1]) == set(range(50))  # the other row is not filtered
    # The kept tokens' probabilities renormalised: log_softmax over them alone.
    idx = torch.tensor(sorted(top))
    assert torch.allclose(draw.logprobs[0, idx], torch.log_softmax(logits[0, idx], -1), atol=TOL)
    many = logits[:1].expand(400, -1)
    tokens = _draw(many, [row(2.0, top_k=k)] * 400).tokens
    assert set(tokens.tolist()) <= top
    if k > 1:
        assert len(set(tokens.tolist())) > 1  # it samples among them, not the argmax


@pytest.mark.parametrize("off", [None, 0, 50, 99])
def test_top_k_none_zero_or_at_least_the_vocabulary_is_off(off: int | None) -> None:
    draw = _draw(_logits(1), [row(1.0, top_k=off)])
    assert _kept(draw.logprobs[0]) == set(range(50))


@pytest.mark.parametrize(("p", "kept"), [(0.4, {0}), (0.75, {0, 1}), (0.85, {0, 1, 2}),
                                         (1.0, {0, 1, 2, 3})])  # fmt: skip
def test_top_p_keeps_the_smallest_head_that_reaches_p(p: float, kept: set[int]) -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    draw = _draw(probs.log(), [row(1.0, top_p=p)])
    assert _kept(draw.logprobs[0]) == kept
    mass = float(probs[0, sorted(kept)].sum())
    for t in kept:
        assert math.isclose(float(draw.logprobs[0, t]), math.log(probs[0, t] / mass), abs_tol=TOL)


def test_filters_combine_per_row() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3)
    out = filter_logits(probs.log(), [2, 0, 3], [1.0, 0.75, 0.6])
    assert [_kept(r) for r in out] == [{0, 1}, {0, 1}, {0, 1}]


@pytest.mark.parametrize("temperature", [0.7, 1.6])
def test_processed_logprobs_are_the_tempered_distribution(temperature: float) -> None:
    logits = _logits(3)
    draw = _draw(logits, [row(temperature)] * 3)
    want = torch.log_softmax(logits / temperature, -1)
    assert torch.allclose(draw.logprobs, want, atol=TOL)
    lp = want.gather(1, draw.tokens[:, None])[:, 0]
    assert torch.allclose(draw.token_logprobs, lp, atol=TOL)


def test_raw_logprobs_are_the_models_distribution() -> None:
    logits = _logits(3)
    draw = _draw(logits, [row(0.7, top_k=3), row(1.6, top_p=0.5), row(1.0)], mode="raw")
    raw = torch.log_softmax(logits, -1)
    assert torch.allclose(draw.logprobs, raw, atol=TOL)
    assert torch.allclose(draw.token_logprobs, raw.gather(1, draw.tokens[:, None])[:, 0], atol=TOL)


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, None), (0.5, None), (2.0, 3)])
def test_draws_follow_the_sampled_distribution(temperature: float, top_k: int | None) -> None:
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, -1.0]])
    n = 20_000
    tokens = _draw(logits.expand(n, -1), [row(temperature, top_k=top_k)] * n, seed=3).tokens
    freq = torch.bincount(tokens, minlength=5).float() / n
    scaled = filter_logits(logits / temperature, [top_k or 0], [1.0])
    want = scaled.softmax(-1)[0]
    assert torch.allclose(freq, want, atol=0.015), (freq, want)


def test_a_seeded_row_draws_the_same_tokens_whatever_shares_its_batch() -> None:
    logits = _logits(3, seed=4)

    def stream(seed: int, batch: list[int], at: int, steps: int = 20) -> list[int]:
        gens = [row_generator(seed) if r == at else None for r in range(len(batch))]
        out = []
        for step in range(steps):
            draw = sample(logits[batch], [row(1.0)] * len(batch), gens, _rng(step), "processed")
            out.append(int(draw.tokens[at]))
        return out

    alone = stream(11, [0], 0)
    assert stream(11, [1, 0, 2], 1) == alone  # other rows, other unseeded noise
    assert stream(12, [0], 0) != alone
    assert row_generator(None) is None


def test_seeded_rows_leave_the_shared_generator_to_the_unseeded_ones() -> None:
    """An unseeded row's noise is the shared generator's, in row order, whatever seeded rows
    share its batch (they draw from their own)."""
    logits = _logits(2, seed=5)
    for step in range(20):
        alone = sample(logits[[1]], [row(1.0)], [None], _rng(step), "processed")
        mixed = sample(logits, [row(1.0)] * 2, [row_generator(7), None], _rng(step), "processed")
        assert int(mixed.tokens[1]) == int(alone.tokens[0])


def test_sample_seed_is_a_fixed_hash_of_the_request_seed_and_the_sample() -> None:
    assert sample_seed(5, 1) == 2014649224381430719
    assert sample_seed(5, 1) != sample_seed(6, 0)  # seed + k would make these equal
    seeds = {sample_seed(s, k) for s in range(20) for k in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)


def test_top_alternatives_are_the_k_largest_and_removed_ones_masked() -> None:
    logp = torch.tensor([-1.0, float("-inf"), -0.5, -3.0, float("-inf")])
    assert top_alternatives(logp, 3) == [(2, -0.5), (0, -1.0), (3, -3.0)]
    alts = top_alternatives(logp, 5)
    assert [t for t, _ in alts[:3]] == [2, 0, 3]
    assert sorted(t for t, _ in alts[3:]) == [1, 4]
    assert [lp for _, lp in alts[3:]] == [MASKED_LOGPROB, MASKED_LOGPROB]
