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
from learner.algorithms import dynamo_params, group_token_counts
from learner.objective import ObjectiveInputs, kl_shaped_token_rewards, rl_objective
from tests.learner.algorithms.test_dynamo import loop_modulate
from tests.learner.algorithms.test_is_corrections import truncated_is_weights

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
    algo = AlgorithmConfig(
        policy_loss=PpoLoss(clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=dual)
    )
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


# --- prompt-mean: every prompt's group weighs the same, whatever its n -------------------------


def loop_prompt_mean(per_token: dict[tuple[int, int], float], groups: list[int]) -> float:
    """Token-mean within each group, mean over the groups that have a valid token."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for (i, _k), v in per_token.items():
        sums[groups[i]] = sums.get(groups[i], 0.0) + v
        counts[groups[i]] = counts.get(groups[i], 0) + 1
    return sum(sums[g] / counts[g] for g in sums) / len(sums)


def grouped_batch(seed: int) -> tuple[dict[str, torch.Tensor], list[int]]:
    """Six rows in three groups of 3, 2 and 1 responses (one response empty), varied lengths."""
    gen = torch.Generator().manual_seed(seed)
    b, t = 6, 7
    lengths = torch.tensor([7, 3, 0, 5, 2, 6])
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    logp = -torch.rand(b, t, generator=gen) * 3
    old = logp + torch.randn(b, t, generator=gen) * 0.3
    x = {
        "logp": logp,
        "old": old,
        "ref": logp + torch.randn(b, t, generator=gen) * 0.2,
        "adv": torch.randn(b, t, generator=gen),
        "ent": torch.rand(b, t, generator=gen) * 3,
        "mask": mask,
    }
    return x, [0, 0, 0, 1, 1, 2]


@pytest.mark.parametrize("seed", range(3))
def test_prompt_mean_is_token_mean_within_groups_then_mean_over_groups(seed: int):
    x, groups = grouped_batch(seed)
    gt = group_token_counts(torch.tensor(groups), x["mask"])
    kl_coef, ent_coef = 0.2, 0.02
    algo = AlgorithmConfig(
        policy_loss=PpoLoss(clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=DUAL),
        agg="prompt-mean",
        kl=KlConfig(coef=kl_coef, kind="k3"),
        entropy_coef=ent_coef,
        modulation=ModulationConfig(enabled=True, preset="decay6"),
        is_cap=None,
    )
    inp = inputs(x, entropy=x["ent"], ref_logp=x["ref"], group_tokens=gt)
    out = rl_objective(inp, algo)
    mod = modulated(x, x["adv"], "decay6")
    per = {}
    for i, k in cells(x["mask"]):
        lp, old = float(x["logp"][i, k]), float(x["old"][i, k])
        per[(i, k)] = (
            loop_ppo_token(lp, old, mod[i][k], DUAL)
            + kl_coef * loop_k3(lp, float(x["ref"][i, k]))
            - ent_coef * float(x["ent"][i, k])
        )
    assert out.loss.item() == pytest.approx(loop_prompt_mean(per, groups), rel=1e-5)
    # The gradient at an unclipped token of group g is −A'·r / (tokens of g · #groups) (+ KL).
    out.loss.backward()
    tokens = {g: sum(1 for i, _ in cells(x["mask"]) if groups[i] == g) for g in set(groups)}
    for i, k in cells(x["mask"]):
        r = math.exp(float(x["logp"][i, k] - x["old"][i, k]))
        if not 1 - CLIP_LOW < r < 1 + CLIP_HIGH:
            continue
        d = float(x["logp"][i, k] - x["ref"][i, k])
        want = (-mod[i][k] * r + kl_coef * (1 - math.exp(-d))) / (tokens[groups[i]] * 3)
        assert float(inp.logp.grad[i, k]) == pytest.approx(want, rel=1e-4, abs=1e-7)


def test_prompt_mean_weighs_a_group_the_same_whatever_its_n():
    """Repeating one group's responses (a larger n, same empirical distribution) leaves the
    prompt-mean loss unchanged; the token-mean loss shifts towards that group."""
    x, groups = grouped_batch(5)
    rep = torch.tensor([0, 1, 2, 3, 4, 5, 5, 5, 5])  # group 2's single response, four times
    y = {k: v[rep] for k, v in x.items()}
    y_groups = [groups[i] for i in rep.tolist()]

    def loss(d: dict, g: list[int], agg: str) -> float:
        algo = AlgorithmConfig(policy_loss=PPO, agg=agg, is_cap=None)
        gt = group_token_counts(torch.tensor(g), d["mask"])
        return rl_objective(inputs(d, group_tokens=gt), algo).loss.item()

    assert loss(y, y_groups, "prompt-mean") == pytest.approx(loss(x, groups, "prompt-mean"))
    assert loss(y, y_groups, "token-mean") != pytest.approx(loss(x, groups, "token-mean"))


def test_prompt_mean_micro_batches_split_inside_a_group_sum_to_the_whole():
    """Gradient accumulation: micro-batches cut through groups; with each row's group token count
    over the mini-batch and the mini-batch's group count as the normaliser they add up."""
    x, groups = grouped_batch(2)
    gt = group_token_counts(torch.tensor(groups), x["mask"])
    algo = AlgorithmConfig(policy_loss=PPO, agg="prompt-mean", kl=KlConfig(coef=0.1))
    whole = rl_objective(inputs(x, ref_logp=x["ref"], group_tokens=gt), algo).loss.item()
    parts = 0.0
    for sl in (slice(0, 2), slice(2, 4), slice(4, 6)):
        part = {k: v[sl] for k, v in x.items()}
        inp = inputs(part, ref_logp=part["ref"], group_tokens=gt[sl])
        parts += rl_objective(inp, algo, normalizer=3.0).loss.item()
    assert parts == pytest.approx(whole, rel=1e-5)


def test_prompt_mean_without_group_counts_names_the_field():
    x, _ = grouped_batch(0)
    algo = AlgorithmConfig(policy_loss=PPO, agg="prompt-mean")
    with pytest.raises(ValueError, match=r"prompt-mean.*group_tokens"):
        rl_objective(inputs(x), algo)


@pytest.mark.parametrize("world", [1, 2])
def test_the_learners_plan_and_normaliser_give_the_whole_batch_prompt_mean(world: int):
    """The learner's own plumbing (``learner.step.plan_batch`` group token counts per micro-batch,
    ``learner.step.normalizer``): micro-batches of 2 rows, mini-batches of 2 groups, split over
    ``world`` ranks, add up to one prompt-mean over each mini-batch."""
    from types import SimpleNamespace

    from learner.batch import Sample
    from learner.step import normalizer, plan_batch

    gen = torch.Generator().manual_seed(7)
    sizes = [3, 1, 4, 2]  # responses per group
    samples = [
        Sample(
            prompt=[5, 6],
            response=torch.randint(
                3, 50, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen
            ).tolist(),
            sampling_logprobs=[],
            reward=0.0,
            correct=False,
            group=g,
        )
        for g, n in enumerate(sizes)
        for _ in range(n)
    ]
    for s in samples:
        s.sampling_logprobs = [-1.0] * len(s.response)
    lc = SimpleNamespace(mini_batch_size=2, train_batch_size=4, micro_batch_size=2)
    algo = AlgorithmConfig(policy_loss=PPO, agg="prompt-mean", is_cap=None)
    adv = {i: float(torch.randn(1, generator=gen)) for i in range(len(samples))}
    lp = {i: (-torch.rand(len(s.response), generator=gen)).tolist() for i, s in enumerate(samples)}
    total: dict[int, float] = {}
    for rank in range(world):
        minis, plan = plan_batch(samples, lc, pad_id=0, rank=rank, world=world)
        for m, (rows, mbs) in enumerate(zip(minis, plan, strict=True)):
            norm = normalizer(samples, rows, "prompt-mean")
            for mb in mbs:
                if not mb.rows:
                    continue
                logp = torch.zeros_like(mb.mask)
                for j, i in enumerate(mb.rows):
                    logp[j, : len(lp[i])] = torch.tensor(lp[i])
                a = torch.tensor([adv[i] for i in mb.rows])[:, None] * mb.mask
                out = rl_objective(
                    ObjectiveInputs(
                        logp=logp,
                        old_logp=logp,
                        advantages=a,
                        mask=mb.mask,
                        group_tokens=mb.group_tokens,
                    ),
                    algo,
                    normalizer=norm,
                )
                total[m] = total.get(m, 0.0) + out.loss.item()
    # On-policy the token loss is −A: prompt-mean = −mean over groups of the group's token-mean.
    for m, groups in enumerate([[0, 1], [2, 3]]):
        want = 0.0
        for g in groups:
            rows = [i for i, s in enumerate(samples) if s.group == g]
            want += -sum(adv[i] * len(samples[i].response) for i in rows) / sum(
                len(samples[i].response) for i in rows
            )
        assert total[m] == pytest.approx(want / len(groups), rel=1e-5)
