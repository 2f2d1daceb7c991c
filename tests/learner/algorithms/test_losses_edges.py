"""Value and DPO losses at their edges: a per-token twin of the clipped value loss, defaults,
the normaliser, metrics, and validation bounds and messages.

Each case here was added for a mutant of ``learner/algorithms/losses.py`` that test_losses.py
let through (docs/testing.md lists them).
"""

from __future__ import annotations

import math

import pytest
import torch

from learner.algorithms.losses import (
    _clipped_surrogate,
    aggregate_loss,
    dpo_loss,
    group_token_counts,
    kl_penalty,
    policy_loss,
    value_loss,
)


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


def test_prompt_mean_weighs_every_group_the_same_by_hand() -> None:
    loss = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0], [5.0, 6.0, 7.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    ids = torch.tensor([0, 0, 1, 2])  # group 2: one row without a valid token
    gt = group_token_counts(ids, mask)
    assert gt.tolist() == [3.0, 3.0, 3.0, 0.0]
    # group 0: (1 + 2 + 3) / 3 = 2; group 1: 18 / 3 = 6; the empty row adds no group.
    assert aggregate_loss(loss, mask, "prompt-mean", group_tokens=gt).item() == pytest.approx(4.0)
    assert aggregate_loss(
        loss, mask, "prompt-mean", group_tokens=gt, normalizer=torch.tensor(3.0)
    ).item() == pytest.approx(8 / 3)  # fmt: skip
    # One group of one token: its value.
    one = aggregate_loss(torch.tensor([[7.0]]), torch.ones(1, 1), "prompt-mean",
                         group_tokens=torch.tensor([1]))  # fmt: skip
    assert one.item() == 7.0
    with pytest.raises(ValueError, match=r"^aggregation 'prompt-mean' needs group_tokens \(each "
                       r"row's group token count; see group_token_counts\)$"):  # fmt: skip
        aggregate_loss(loss, mask, "prompt-mean")
    with pytest.raises(ValueError, match=r"^group_tokens must be \[B\] = \(4,\), got \(3,\)$"):
        aggregate_loss(loss, mask, "prompt-mean", group_tokens=gt[:3])


def test_aggregation_modes_at_their_edges_and_messages() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    only_first = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    # One row with tokens: the sequence means are over that row alone.
    assert aggregate_loss(loss, only_first, "seq-mean-token-sum").item() == 3.0
    # The constant length: norm_len when given, else T (4 here; B is 2).
    assert aggregate_loss(loss, only_first, "seq-mean-token-sum-norm").item() == 0.75
    assert aggregate_loss(loss, only_first, "seq-mean-token-sum-norm", norm_len=3).item() == 1.0
    with pytest.raises(ValueError, match=r"^unknown aggregation mode 'x'; known: token-mean, "):
        aggregate_loss(loss, only_first, "x")
    with pytest.raises(
        ValueError, match=r"^loss must have the shape of mask \(2, 4\), got \(2,\)$"
    ):
        aggregate_loss(loss[:, 0], only_first, "token-mean")
    with pytest.raises(ValueError, match=r"^mask must be \[B, T\], got shape \(4,\)$"):
        aggregate_loss(loss, only_first[0], "token-mean")


def _fractions(ratio: float, adv: float, dual_clip: float | None = 3.0) -> tuple[float, ...]:
    _, m = _clipped_surrogate(torch.tensor([[ratio]]), torch.tensor([[adv]]),
                              torch.ones(1, 1, dtype=torch.bool), 0.25, 0.5, dual_clip)  # fmt: skip
    return m["clipfrac_upper"].item(), m["clipfrac_lower"].item(), m["clipfrac_dual"].item()


def test_clip_fractions_count_strictly_outside_the_bounds_and_only_for_their_sign() -> None:
    # Bounds 1 − 0.25 and 1 + 0.5 (exact in float32), dual clip 3.
    assert _fractions(1.5, 1.0) == (0.0, 0.0, 0.0)  # at the upper bound: not clipped
    assert _fractions(1.75, 1.0) == (1.0, 0.0, 0.0)
    assert _fractions(0.75, -1.0) == (0.0, 0.0, 0.0)  # at the lower bound
    assert _fractions(0.5, -1.0) == (0.0, 1.0, 0.0)
    assert _fractions(1.1, -1.0) == (0.0, 0.0, 0.0)  # above 1 − ε_low: not lower-clipped
    assert _fractions(2.0, 0.0) == (0.0, 0.0, 0.0)  # A = 0 is neither side
    assert _fractions(0.5, 0.0) == (0.0, 0.0, 0.0)
    assert _fractions(4.0, 0.0) == (0.0, 0.0, 0.0)
    assert _fractions(0.5, 0.5) == (0.0, 0.0, 0.0)  # A > 0 below the band: not "lower"
    assert _fractions(4.0, 0.5) == (1.0, 0.0, 0.0)  # A > 0: upper, never dual
    assert _fractions(3.0, -1.0) == (0.0, 0.0, 0.0)  # at the dual bound
    assert _fractions(3.5, -1.0) == (0.0, 0.0, 1.0)


def test_clip_bounds_accept_zero_and_refuse_any_negative_or_a_dual_clip_of_one() -> None:
    assert _clipped_surrogate(torch.ones(1, 1), torch.ones(1, 1), torch.ones(1, 1).bool(),
                              0.0, 0.0, None)[0].item() == -1.0  # fmt: skip
    for low, high in ((-0.1, 0.2), (0.2, -0.1)):
        with pytest.raises(ValueError, match=rf"^clip_low and clip_high must be >= 0, got {low}, "
                           rf"{high}$"):  # fmt: skip
            _clipped_surrogate(torch.ones(1, 1), torch.ones(1, 1), torch.ones(1, 1).bool(),
                               low, high, None)  # fmt: skip
    with pytest.raises(ValueError, match=r"^dual_clip must be a constant > 1"):
        _fractions(1.0, 1.0, dual_clip=1.0)


def test_kl_k3_stays_finite_for_an_infinite_log_ratio_and_names_the_kinds() -> None:
    logp = torch.tensor([[-math.inf, 0.0]])
    ref = torch.tensor([[0.0, -math.inf]])
    assert kl_penalty(logp, ref, "k3").tolist() == [[10.0, 10.0]]
    with pytest.raises(
        ValueError, match=r"^unknown KL kind 'x'; known: k1, abs, k2, k3, low_var_kl$"
    ):
        kl_penalty(logp, ref, "x")


def test_dpo_label_smoothing_and_reward_metrics_by_hand() -> None:
    pc, pr = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -2.0])
    rc, rr = torch.tensor([-1.5, -1.0]), torch.tensor([-2.0, -2.0])
    beta, eps = 0.5, 0.1
    loss, m = dpo_loss(pc, pr, rc, rr, beta=beta, label_smoothing=eps)
    h = [(-1.0 + 1.5) - (-3.0 + 2.0), (-2.0 + 1.0) - (-2.0 + 2.0)]  # 1.5, -1.0: not symmetric

    def logsig(x: float) -> float:
        return -math.log1p(math.exp(-x))

    want = sum(-(1 - eps) * logsig(beta * x) - eps * logsig(-beta * x) for x in h) / 2
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert set(m) == {"reward_chosen", "reward_rejected", "reward_accuracy", "reward_margin"}
    assert m["reward_chosen"].item() == pytest.approx(beta * (0.5 - 1.0) / 2)
    assert m["reward_rejected"].item() == pytest.approx(beta * (-1.0 + 0.0) / 2)
    assert m["reward_accuracy"].item() == 0.5
    # A tie is not a correct preference.
    tie = dpo_loss(pc[:1], pc[:1], rc[:1], rc[:1])[1]["reward_accuracy"].item()
    assert tie == 0.0


def test_float64_stays_float64_and_the_value_loss_passes_group_tokens() -> None:
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    mask = torch.ones(2, 2)
    loss, _ = value_loss(v, v, v + 1, mask, clip=None)
    assert loss.dtype == torch.float64
    gt = group_token_counts(torch.tensor([0, 1]), mask)
    pm, _ = value_loss(v, v, v + 1, mask, clip=None, agg="prompt-mean", group_tokens=gt)
    assert pm.item() == pytest.approx(0.5)


def test_every_tensor_a_loss_builds_is_on_its_inputs_device() -> None:
    """As for the advantages: with ``meta`` as the default device, a tensor built without the
    inputs' device meets the CPU inputs."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    ids = torch.tensor([0, 0, 1])

    def every() -> list[torch.Tensor]:
        gt = group_token_counts(ids, mask)
        out = [gt, kl_penalty(x, y, "k3")]
        for agg in ("token-mean", "seq-mean-token-mean", "prompt-mean"):
            out.append(aggregate_loss(x, mask, agg, group_tokens=gt))
        for clip in (None, 0.2):
            loss, m = value_loss(x, y, x + y, mask, clip=clip)
            out += [loss, *m.values()]
        loss, m = policy_loss(x, y, x - y, mask, dual_clip=3.0)
        return [*out, loss, *m.values()]

    expected = every()
    with torch.device("meta"):  # tensors made from here on without a device are meta
        got = every()
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.device.type == "cpu" and torch.equal(g, e), i


def test_group_token_counts_follow_the_masks_device() -> None:
    mask = torch.ones(3, 2, device="meta")  # the ids stay on the CPU, as the learner has them
    assert group_token_counts(torch.tensor([0, 0, 1]), mask).device == mask.device
