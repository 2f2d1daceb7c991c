"""The RL objective of one micro-batch: each term switched on alone, then all of them together,
against plain-Python loop computations of the formulas."""

from __future__ import annotations

import math

import pytest
import torch

from dynamo_rl.config.learner import (
    AlgorithmConfig,
    CriticConfig,
    GspoLoss,
    KlConfig,
    ModulationConfig,
    PpoLoss,
)
from learner.algorithms import dynamo_params
from learner.objective import (
    ObjectiveInputs,
    kl_shaped_token_rewards,
    rl_objective,
    truncated_is_weights,
)
from tests.learner.algorithms.test_dynamo import loop_modulate

CLIP_LOW, CLIP_HIGH, DUAL = 0.2, 0.28, 3.0


def batch(seed: int, b: int = 4, t: int = 7) -> dict[str, torch.Tensor]:
    """A hand-made micro-batch: ratios inside and outside the clip range, both advantage signs,
    rows of different lengths (one empty), garbage in the padding."""
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=gen) * 3
    old = logp + torch.randn(b, t, generator=gen) * 0.3
    lengths = torch.tensor([t, 3, 0, 5])[:b]
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    return {
        "logp": logp,
        "old": old,
        "ref": logp + torch.randn(b, t, generator=gen) * 0.2,
        "sampling": old + torch.randn(b, t, generator=gen) * 0.5,
        "adv": torch.randn(b, t, generator=gen),
        "ent": torch.rand(b, t, generator=gen) * 3,
        "values": torch.randn(b, t, generator=gen),
        "old_values": torch.randn(b, t, generator=gen),
        "returns": torch.randn(b, t, generator=gen),
        "mask": mask,
    }


def cells(mask: torch.Tensor) -> list[tuple[int, int]]:
    return [(i, k) for i in range(mask.shape[0]) for k in range(mask.shape[1]) if mask[i, k]]


def loop_ppo_token(lp: float, old: float, a: float, dual: float | None) -> float:
    r = math.exp(lp - old)
    loss = max(-a * r, -a * min(max(r, 1 - CLIP_LOW), 1 + CLIP_HIGH))
    if dual is not None and a < 0:
        loss = min(loss, -a * dual)
    return loss


def loop_k3(lp: float, ref: float) -> float:
    d = lp - ref
    return math.exp(-d) + d - 1


def loop_value(v: float, v_old: float, ret: float, clip: float) -> float:
    clipped = v_old + min(max(v - v_old, -clip), clip)
    return 0.5 * max((v - ret) ** 2, (clipped - ret) ** 2)


def token_mean(per_token: dict[tuple[int, int], float], norm: float) -> float:
    return sum(per_token.values()) / norm


def inputs(x: dict[str, torch.Tensor], adv: torch.Tensor | None = None, **kw) -> ObjectiveInputs:
    return ObjectiveInputs(
        logp=x["logp"].clone().requires_grad_(True),
        old_logp=x["old"],
        advantages=x["adv"] if adv is None else adv,
        mask=x["mask"],
        **kw,
    )


def modulated(x: dict, adv: torch.Tensor, preset: str) -> list[list[float]]:
    """The loop twin's modulated advantages of batch ``x`` under ``preset``."""
    p = dynamo_params(preset)
    mod, _ = loop_modulate(
        adv.tolist(),
        x["logp"].tolist(),
        x["old"].tolist(),
        x["ent"].tolist(),
        x["mask"].int().tolist(),
        CLIP_LOW,
        CLIP_HIGH,
        p.lambda_min,
        p.gamma,
        p.tau,
        p.mu_max,
    )
    return mod


PPO = PpoLoss(clip_low=CLIP_LOW, clip_high=CLIP_HIGH)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dual", [None, DUAL])
def test_policy_loss_alone_is_the_clipped_surrogate(seed: int, dual: float | None):
    x = batch(seed)
    algo = AlgorithmConfig(policy_loss=PpoLoss(clip_low=CLIP_LOW, clip_high=CLIP_HIGH,
                                               dual_clip=dual))  # fmt: skip
    inp = inputs(x)
    out = rl_objective(inp, algo, normalizer=20.0)
    per = {
        c: loop_ppo_token(float(x["logp"][c]), float(x["old"][c]), float(x["adv"][c]), dual)
        for c in cells(x["mask"])
    }
    assert out.loss.item() == pytest.approx(token_mean(per, 20.0), rel=1e-5, abs=1e-6)
    assert float(out.policy_loss) == pytest.approx(out.loss.item())
    assert out.kl_sum is None and out.entropy_loss is None and out.value_loss is None
    assert set(out.metrics) >= {"clipfrac_upper", "clipfrac_lower"}
    # Without a normaliser the micro-batch's own valid-token count is the denominator.
    alone = rl_objective(inputs(x), algo)
    assert alone.loss.item() == pytest.approx(token_mean(per, len(per)), rel=1e-5, abs=1e-6)
    # Gradient at an unclipped token: ∂ℓ/∂logp = −A r / N; none at padding.
    out.loss.backward()
    g = inp.logp.grad
    assert float(g[x["mask"] == 0].abs().sum()) == 0.0
    for c in cells(x["mask"]):
        r = math.exp(float(x["logp"][c] - x["old"][c]))
        a = float(x["adv"][c])
        if 1 - CLIP_LOW < r < 1 + CLIP_HIGH:
            assert float(g[c]) == pytest.approx(-a * r / 20.0, rel=1e-4, abs=1e-7)


def test_is_weights_alone_multiply_the_advantages():
    x = batch(1)
    cap = 2.0
    w = truncated_is_weights(x["old"], x["sampling"], x["mask"], cap)
    for i in range(w.shape[0]):
        for k in range(w.shape[1]):
            want = min(math.exp(float(x["old"][i, k] - x["sampling"][i, k])), cap)
            assert float(w[i, k]) == pytest.approx(want if x["mask"][i, k] else 0.0, rel=1e-6)
    assert float(w.max()) == pytest.approx(cap)  # some tokens are capped
    algo = AlgorithmConfig(policy_loss=PPO)
    out = rl_objective(inputs(x, is_weights=w), algo, normalizer=15.0)
    per = {
        c: loop_ppo_token(float(x["logp"][c]), float(x["old"][c]), float(x["adv"][c] * w[c]), None)
        for c in cells(x["mask"])
    }
    assert out.loss.item() == pytest.approx(token_mean(per, 15.0), rel=1e-5)
    plain = rl_objective(inputs(x), algo, normalizer=15.0)
    assert plain.loss.item() != pytest.approx(out.loss.item(), rel=1e-3)


@pytest.mark.parametrize("seed", range(3))
def test_modulation_alone_is_dynamo_over_this_micro_batch(seed: int):
    x = batch(seed)
    algo = AlgorithmConfig(policy_loss=PPO, modulation=ModulationConfig(enabled=True))
    out = rl_objective(inputs(x, entropy=x["ent"]), algo, normalizer=15.0)
    mod = modulated(x, x["adv"], "decay6")
    per = {
        (i, k): loop_ppo_token(float(x["logp"][i, k]), float(x["old"][i, k]), mod[i][k], None)
        for i, k in cells(x["mask"])
    }
    assert out.loss.item() == pytest.approx(token_mean(per, 15.0), rel=1e-5)
    assert {"beta_comp_mean", "beta_stab_mean", "multiplier_mean"} <= set(out.metrics)
    got = out.advantages
    for i, k in cells(x["mask"]):
        assert float(got[i, k]) == pytest.approx(mod[i][k], rel=1e-5, abs=1e-7)
    # The statistics are this micro-batch's: the same rows inside a larger batch modulate
    # differently (another entropy range, another largest change).
    bigger = {k: torch.cat([v, batch(seed + 10)[k] * 2.0]) for k, v in x.items()}
    bigger["mask"] = torch.cat([x["mask"], batch(seed + 10)["mask"]])
    whole = rl_objective(inputs(bigger, entropy=bigger["ent"]), algo)
    assert not torch.allclose(whole.advantages[: x["adv"].shape[0]], got)
    with pytest.raises(ValueError, match="entropies"):
        rl_objective(inputs(x), algo)


def test_kl_in_loss_alone():
    x = batch(2)
    zero = torch.zeros_like(x["adv"])  # the policy term vanishes: the loss is the KL term
    algo = AlgorithmConfig(policy_loss=PPO, kl=KlConfig(coef=0.3, kind="k3"))
    inp = inputs(x, adv=zero, ref_logp=x["ref"])
    out = rl_objective(inp, algo, normalizer=15.0)
    per = {c: loop_k3(float(x["logp"][c]), float(x["ref"][c])) for c in cells(x["mask"])}
    assert out.loss.item() == pytest.approx(0.3 * token_mean(per, 15.0), rel=1e-5)
    assert float(out.kl_sum) == pytest.approx(sum(per.values()), rel=1e-5)
    out.loss.backward()  # ∂k3/∂logp = 1 − exp(−d)
    for c in cells(x["mask"]):
        d = float(x["logp"][c] - x["ref"][c])
        assert float(inp.logp.grad[c]) == pytest.approx(0.3 * (1 - math.exp(-d)) / 15.0, rel=1e-4)
    with pytest.raises(ValueError, match="reference"):
        rl_objective(inputs(x), algo)


def test_kl_in_reward_shapes_token_rewards():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    kl = torch.tensor([[0.1, -0.2, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0]])
    got = kl_shaped_token_rewards(torch.tensor([1.0, -1.0]), mask, kl, 0.5)
    want = [[-0.05, 0.1, 1.0 - 0.15], [-1.0 - 0.25]]
    assert got[0, :3].tolist() == pytest.approx(want[0])
    assert float(got[1, 0]) == pytest.approx(want[1][0])


def test_entropy_bonus_alone():
    x = batch(0)
    zero = torch.zeros_like(x["adv"])
    algo = AlgorithmConfig(policy_loss=PPO, entropy_coef=0.01)
    ent = x["ent"].clone().requires_grad_(True)
    out = rl_objective(inputs(x, adv=zero, entropy=ent), algo, normalizer=15.0)
    per = {c: float(x["ent"][c]) for c in cells(x["mask"])}
    assert out.loss.item() == pytest.approx(-0.01 * token_mean(per, 15.0), rel=1e-5)
    assert float(out.entropy_loss) == pytest.approx(token_mean(per, 15.0), rel=1e-5)
    out.loss.backward()  # the bonus pushes every valid token's entropy up, padding untouched
    want = -0.01 / 15.0 * x["mask"]
    assert torch.allclose(ent.grad, want, atol=1e-9)


def test_value_loss_alone():
    x = batch(1)
    zero = torch.zeros_like(x["adv"])
    algo = AlgorithmConfig(policy_loss=PPO)
    critic = CriticConfig(enabled=True, value_coef=0.7, value_clip=0.3)
    values = x["values"].clone().requires_grad_(True)
    out = rl_objective(
        inputs(x, adv=zero, values=values, old_values=x["old_values"], returns=x["returns"]),
        algo,
        critic,
        normalizer=15.0,
    )
    per = {
        c: loop_value(float(x["values"][c]), float(x["old_values"][c]), float(x["returns"][c]), 0.3)
        for c in cells(x["mask"])
    }
    assert out.loss.item() == pytest.approx(0.7 * token_mean(per, 15.0), rel=1e-5)
    assert float(out.value_loss) == pytest.approx(token_mean(per, 15.0), rel=1e-5)
    assert "vf_clipfrac" in out.metrics
    out.loss.backward()
    assert values.grad is not None and float(values.grad[x["mask"] == 0].abs().sum()) == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_all_terms_together_add_up(seed: int):
    x = batch(seed)
    cap, kl_coef, ent_coef, vf_coef, vclip = 1.5, 0.2, 0.02, 0.5, 0.25
    algo = AlgorithmConfig(
        policy_loss=PpoLoss(clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=DUAL),
        kl=KlConfig(coef=kl_coef, kind="k3"),
        entropy_coef=ent_coef,
        modulation=ModulationConfig(enabled=True, preset="decay5"),
        is_cap=cap,
    )
    critic = CriticConfig(enabled=True, value_coef=vf_coef, value_clip=vclip)
    w = truncated_is_weights(x["old"], x["sampling"], x["mask"], cap)
    out = rl_objective(
        inputs(
            x,
            entropy=x["ent"],
            ref_logp=x["ref"],
            is_weights=w,
            values=x["values"],
            old_values=x["old_values"],
            returns=x["returns"],
        ),
        algo,
        critic,
        normalizer=18.0,
    )
    mod = modulated(x, x["adv"] * w, "decay5")
    total = 0.0
    for i, k in cells(x["mask"]):
        lp, old = float(x["logp"][i, k]), float(x["old"][i, k])
        total += loop_ppo_token(lp, old, mod[i][k], DUAL)
        total += kl_coef * loop_k3(lp, float(x["ref"][i, k]))
        total -= ent_coef * float(x["ent"][i, k])
        v, vo, ret = (float(x[n][i, k]) for n in ("values", "old_values", "returns"))
        total += vf_coef * loop_value(v, vo, ret, vclip)
    assert out.loss.item() == pytest.approx(total / 18.0, rel=1e-5)


def test_micro_batches_with_the_mini_batch_normaliser_sum_to_the_whole():
    """Gradient accumulation: halves normalised by the whole count add up to the whole."""
    x = batch(4)
    algo = AlgorithmConfig(policy_loss=PPO, kl=KlConfig(coef=0.1))
    n = float(x["mask"].sum())
    whole = rl_objective(inputs(x, ref_logp=x["ref"]), algo, normalizer=n)
    parts = 0.0
    for sl in (slice(0, 2), slice(2, 4)):
        part = {k: v[sl] for k, v in x.items()}
        parts += rl_objective(inputs(part, ref_logp=part["ref"]), algo, normalizer=n).loss.item()
    assert parts == pytest.approx(whole.loss.item(), rel=1e-5)


def test_gspo_aggregates_per_sequence():
    x = batch(0)
    algo = AlgorithmConfig(policy_loss=GspoLoss(), agg="seq-mean-token-mean")
    out = rl_objective(inputs(x), algo)
    # On-policy (old = logp) the sequence ratio is 1: the loss is −mean over rows of mean A.
    on = rl_objective(
        ObjectiveInputs(logp=x["logp"], old_logp=x["logp"], advantages=x["adv"], mask=x["mask"]),
        algo,
    )
    rows = [i for i in range(x["mask"].shape[0]) if x["mask"][i].sum() > 0]
    want = -sum(float((x["adv"][i] * x["mask"][i]).sum() / x["mask"][i].sum()) for i in rows)
    assert on.loss.item() == pytest.approx(want / len(rows), rel=1e-5)
    assert torch.isfinite(out.loss)
