"""Value and DPO losses at their edges: a per-token twin of the clipped value loss, defaults,
the normaliser, metrics, and validation bounds and messages.

Each case here was added for a mutant of ``learner/algorithms/losses.py`` that test_losses.py
let through (docs/testing.md lists them).
"""

from __future__ import annotations

import math

import pytest
import torch

from learner.algorithms.losses import dpo_loss, group_token_counts, value_loss


def _twin_value_loss(v, v_old, ret, mask, clip):
    """½ max((V − R)², (V_old + clip(V − V_old, ±c) − R)²) per valid token, token-mean."""
    terms, clipped_wins = [], 0
    for row_v, row_o, row_r, row_m in zip(v, v_old, ret, mask, strict=True):
        for a, o, r, m in zip(row_v, row_o, row_r, row_m, strict=True):
            if not m:
                continue
            un = (a - r) ** 2
            if clip is None:
                terms.append(0.5 * un)
                continue
            cl = (o + min(max(a - o, -clip), clip) - r) ** 2
            clipped_wins += cl > un
            terms.append(0.5 * max(un, cl))
    return sum(terms) / max(len(terms), 1), clipped_wins / max(len(terms), 1)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("clip", [0.2, 0.5, None])
def test_value_loss_matches_a_per_token_twin(seed: int, clip: float | None) -> None:
    gen = torch.Generator().manual_seed(seed)
    v, v_old, ret = (torch.randn(4, 6, generator=gen) for _ in range(3))
    mask = (torch.rand(4, 6, generator=gen) > 0.3).float()
    loss, m = value_loss(v, v_old, ret, mask, clip=clip)
    want, frac = _twin_value_loss(v.tolist(), v_old.tolist(), ret.tolist(), mask.tolist(), clip)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert m["vf_clipfrac"].item() == pytest.approx(frac)
    valid = mask.bool()
    assert m["vf_mean"].item() == pytest.approx(v[valid].mean().item(), rel=1e-5)
    if clip == 0.2:  # the default
        assert value_loss(v, v_old, ret, mask)[0].item() == loss.item()


def test_value_loss_clip_zero_normalizer_and_errors() -> None:
    v, old, ret = torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    mask = torch.ones(1, 2)
    loss, m = value_loss(
        v, old, ret, mask, clip=0.0
    )  # clip 0 pins V to V_old: max(4, 1), max(1, 1)
    assert loss.item() == pytest.approx(0.5 * (4.0 + 1.0) / 2) and m["vf_clipfrac"].item() == 0.0
    assert value_loss(v, old, ret, mask, normalizer=10.0)[0].item() == pytest.approx(0.5 * 5 / 10)
    with pytest.raises(ValueError, match=r"^value clip must be >= 0 or None, got -0.1"):
        value_loss(v, old, ret, mask, clip=-0.1)
    for name in ("values", "old_values", "returns"):
        args = {"values": v, "old_values": old, "returns": ret, name: torch.zeros(1, 3)}
        with pytest.raises(ValueError, match=rf"^{name} must have the shape of mask"):
            value_loss(**args, mask=mask)


def test_dpo_defaults_and_validation() -> None:
    pc, pr = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0])
    rc, rr = torch.tensor([-2.0, -2.0]), torch.tensor([-2.0, -2.0])
    assert dpo_loss(pc, pr, rc, rr)[0].item() == dpo_loss(pc, pr, rc, rr, beta=0.1)[0].item()
    h = torch.tensor([2.0, -1.0])  # (π_c − ref_c) − (π_r − ref_r)
    want = sum(math.log1p(math.exp(-0.1 * x)) for x in h.tolist()) / 2
    assert dpo_loss(pc, pr, rc, rr)[0].item() == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match=r"^beta must be > 0, got 0"):
        dpo_loss(pc, pr, rc, rr, beta=0)
    for eps in (0.5, 1.0, -0.1):
        with pytest.raises(ValueError, match=r"^label_smoothing must be in \[0, 0.5\), got"):
            dpo_loss(pc, pr, rc, rr, label_smoothing=eps)
    assert dpo_loss(pc, pr, rc, rr, label_smoothing=0.49)[0].item() > 0
    with pytest.raises(ValueError, match=r"unknown DPO kind 'hinge'; known: sigmoid, ipo$"):
        dpo_loss(pc, pr, rc, rr, kind="hinge")
    two_d = pc[:, None]
    with pytest.raises(ValueError, match=r"DPO inputs must all be \[B\] with the same B"):
        dpo_loss(two_d, two_d, two_d, two_d)  # one shape, but not [B]
    with pytest.raises(ValueError, match=r"DPO inputs must all be \[B\] with the same B"):
        dpo_loss(pc, pr[:1], rc, rr)


def test_group_token_counts_sums_each_groups_valid_tokens() -> None:
    # Group ids in any order and spacing; a mask of 0/1 integers (any nonzero is valid).
    mask = torch.tensor([[1, 1, 0, 0], [2, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    ids = torch.tensor([40, -3, 40, 7, -3])
    counts = group_token_counts(ids, mask)
    assert counts.dtype == torch.float32 and counts.shape == (5,)
    # group 40: rows 0 and 2 (2 + 1); group -3: rows 1 and 4 (3 + 4); group 7: row 3 (0)
    assert counts.tolist() == [3.0, 7.0, 3.0, 0.0, 7.0]
    one = group_token_counts(torch.tensor([5]), torch.tensor([[1, 0, 1]]))
    assert one.tolist() == [2.0]
    empty = group_token_counts(torch.zeros(0, dtype=torch.long), torch.zeros(0, 3))
    assert empty.shape == (0,) and empty.dtype == torch.float32


@pytest.mark.parametrize("ids", [torch.tensor([[0], [1]]), torch.tensor([0, 1, 2])])
def test_group_token_counts_names_the_shape_it_wants(ids: torch.Tensor) -> None:
    shape = tuple(ids.shape)
    with pytest.raises(ValueError) as e:
        group_token_counts(ids, torch.ones(2, 3))
    assert str(e.value) == f"group_ids must be [B] with B = 2 rows, got {shape}"
