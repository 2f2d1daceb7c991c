"""The RL step (``learner/step.py``) in process, on a tiny model: what its update is made of.

Each test runs :class:`learner.step.RLStep` itself (the learner's and every training benchmark's
update) and checks one property against a hand computation or a second layout: gradient
accumulation over micro-batches, modulation per micro-batch, the prompt-mean weighting, the IS
weights, the old pass as the ratio's denominator across epochs, and what ``update`` changes."""

from __future__ import annotations

import math

import pytest
import torch

from dynamo_rl.config.learner import (
    AlgorithmConfig,
    LearnerConfig,
    ModulationConfig,
    OptimConfig,
    PpoLoss,
)
from learner.algorithms import dynamo_modulate, grpo_advantages, policy_loss
from learner.batch import Sample, collate
from learner.step import RLBatch, RLStep, adamw, policy_forward

GROUPS = [0, 0, 1, 1, 1, 1, 2, 2]  # unequal groups: prompt-mean and token-mean differ
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
LENGTHS = [6, 3, 5, 1, 6, 4, 2, 6]


def samples(temperature: float = 1.0, sampling: list[list[float]] | None = None) -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for j, (g, r, n) in enumerate(zip(GROUPS, REWARDS, LENGTHS, strict=True)):
        out.append(
            Sample(
                prompt=torch.randint(3, 200, (3 + 2 * (j % 2),), generator=gen).tolist(),
                response=torch.randint(3, 200, (n,), generator=gen).tolist(),
                sampling_logprobs=sampling[j] if sampling else [-5.0] * n,
                reward=r,
                correct=r > 0,
                group=g,
                temperature=temperature,
            )
        )
    return out


def config(agg="token-mean", micro=8, modulate=False, is_cap=None, epochs=1, mini=None, lr=1e-3):
    return LearnerConfig(
        lr=lr,
        train_batch_size=3,
        mini_batch_size=mini,
        micro_batch_size=micro,
        ppo_epochs=epochs,
        optim=OptimConfig(grad_clip=None),
        algorithm=AlgorithmConfig(
            policy_loss=PpoLoss(clip_low=0.2, clip_high=0.28, dual_clip=10.0),
            agg=agg,
            modulation=ModulationConfig(enabled=modulate),
            is_cap=is_cap,
        ),
    )


def gradient(policy, lc: LearnerConfig, batch: list[Sample]) -> tuple[torch.Tensor, dict]:
    """The step's whole-batch gradient (``update=False``) and its record."""
    policy.zero_grad(set_to_none=True)
    record = RLStep(lc, policy, None, pad_id=0)(RLBatch(batch, ["a", "b", "c"]), update=False)
    grads = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
    return grads, record.record


def test_micro_batches_accumulate_to_the_batch_gradient(policy) -> None:
    whole, _ = gradient(policy, config(micro=8), samples())
    split, _ = gradient(policy, config(micro=3), samples())
    assert whole.abs().sum() > 0
    assert torch.allclose(whole, split, rtol=1e-4, atol=1e-7)
    # The logits are divided by the sampling temperature: another temperature, another gradient.
    assert not torch.allclose(whole, gradient(policy, config(), samples(temperature=0.5))[0])


def test_prompt_mean_weighs_every_group_equally_whatever_the_micro_batches(policy) -> None:
    """The prompt-mean batch gradient is the mean over groups of each group's own token-mean
    gradient (advantages over the whole batch), with micro-batches that cut group 1 in two."""
    got, _ = gradient(policy, config("prompt-mean", micro=3), samples())
    batch = samples()
    mb = collate(batch, list(range(len(batch))), pad_id=0)
    adv = grpo_advantages(torch.tensor(REWARDS), torch.tensor(GROUPS))[:, None] * mb.mask
    policy.zero_grad(set_to_none=True)
    logp, _, _ = policy_forward(policy, mb)
    for g in sorted(set(GROUPS)):
        rows = torch.tensor([i for i, x in enumerate(GROUPS) if x == g])
        loss, _ = policy_loss(logp[rows], logp[rows].detach(), adv[rows], mb.mask[rows],
                              clip_low=0.2, clip_high=0.28, dual_clip=10.0)  # fmt: skip
        (loss / 3).backward(retain_graph=True)
    want = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)
    token, _ = gradient(policy, config("token-mean", micro=3), samples())
    assert not torch.allclose(got, token, rtol=1e-3)


def test_modulation_is_per_micro_batch(policy) -> None:
    """Micro-batch by micro-batch: dynamo_modulate over that micro-batch's tokens, then the
    policy loss normalised by the whole batch — not modulation over the whole batch."""
    got, _ = gradient(policy, config(micro=4, modulate=True), samples())
    batch = samples()
    adv = grpo_advantages(torch.tensor(REWARDS), torch.tensor(GROUPS))
    norm = float(sum(LENGTHS))
    policy.zero_grad(set_to_none=True)
    for rows in ([0, 1, 2, 3], [4, 5, 6, 7]):
        mb = collate(batch, rows, pad_id=0)
        logp, ent, _ = policy_forward(policy, mb)
        a = adv[rows][:, None] * mb.mask
        a, _ = dynamo_modulate(a, logp.detach(), logp.detach(), ent, mb.mask,
                               clip_low=0.2, clip_high=0.28)  # fmt: skip
        loss, _ = policy_loss(logp, logp.detach(), a, mb.mask, clip_low=0.2, clip_high=0.28,
                              dual_clip=10.0, normalizer=norm)  # fmt: skip
        loss.backward()
    want = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)
    assert not torch.allclose(got, gradient(policy, config(micro=8, modulate=True), samples())[0],
                              rtol=1e-3)  # fmt: skip


def test_is_weights_from_the_sampling_logprobs_scale_the_update(policy) -> None:
    """On-policy the PPO gradient is linear in the advantages: sampling log-probs log 2 below
    the old pass's give IS weights of 2 on every token (cap 3), and twice the gradient."""
    batch = samples()
    with torch.no_grad():
        old, _, _ = policy_forward(policy, collate(batch, list(range(len(batch))), pad_id=0))
    same = [old[j, :n].tolist() for j, n in enumerate(LENGTHS)]
    halved = [[x - math.log(2.0) for x in row] for row in same]
    plain, rec1 = gradient(policy, config(is_cap=3.0), samples(sampling=same))
    doubled, rec2 = gradient(policy, config(is_cap=3.0), samples(sampling=halved))
    assert plain.abs().sum() > 0
    assert rec1["is_weight_mean"] == pytest.approx(1.0, rel=1e-4)
    assert rec2["is_weight_mean"] == pytest.approx(2.0, rel=1e-4)
    assert torch.allclose(doubled, 2 * plain, rtol=1e-3, atol=1e-6)


def test_later_updates_see_the_old_pass_as_their_denominator(policy) -> None:
    """One update is on-policy (ratio 1, nothing clipped); with two epochs of two mini-batches
    the later updates' ratio leaves 1 against the batch-start log-probs and tokens get clipped."""
    state = {k: v.clone() for k, v in policy.state_dict().items()}
    one = config(lr=0.05)
    rec = RLStep(one, policy, adamw(policy, one), pad_id=0)(RLBatch(samples(), ["a", "b", "c"]))
    assert rec.record["ratio_mean"] == pytest.approx(1.0)
    assert rec.record["clip_frac_upper"] + rec.record["clip_frac_lower"] == 0.0
    policy.load_state_dict(state)
    four = config(lr=0.05, epochs=2, mini=2)
    rec = RLStep(four, policy, adamw(policy, four), pad_id=0)(RLBatch(samples(), ["a", "b", "c"]))
    policy.load_state_dict(state)
    assert len(rec.record["update_losses"]) == len(rec.record["grad_norms"]) == 4
    assert rec.record["ratio_mean"] != pytest.approx(1.0, abs=1e-3)
    assert rec.record["clip_frac_upper"] + rec.record["clip_frac_lower"] > 0


def test_update_steps_the_optimizer_and_a_measure_leaves_the_weights(policy) -> None:
    state = {k: v.clone() for k, v in policy.state_dict().items()}
    lc = config()
    step = RLStep(lc, policy, adamw(policy, lc), pad_id=0)
    step(RLBatch(samples(), ["a", "b", "c"]), update=False)
    assert all(torch.equal(v, state[k]) for k, v in policy.state_dict().items())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())
    policy.zero_grad(set_to_none=True)
    step(RLBatch(samples(), ["a", "b", "c"]))
    moved = [k for k, v in policy.state_dict().items() if not torch.equal(v, state[k])]
    policy.load_state_dict(state)
    assert moved
    assert all(p.grad is None for p in policy.parameters())  # zeroed after the step


def test_a_kl_term_without_a_reference_is_refused(policy) -> None:
    lc = LearnerConfig(algorithm=AlgorithmConfig(kl={"coef": 0.1}))
    with pytest.raises(ValueError, match="reference"):
        RLStep(lc, policy, None, pad_id=0)
