"""The sample-efficiency benchmark's own logic: its scorer shortcut agrees with the reward service,
and its summary arithmetic (rollouts to a target, response masks) is right."""

from __future__ import annotations

import pytest
import torch

from services.reward.math_answer import score_math
from tests.benchmarks.bench import bench_module, rollouts


@pytest.fixture(scope="module")
def se():
    return bench_module("sample_efficiency")


RESPONSES = [
    "\\boxed{85}",
    "\\boxed{86}",
    "\\boxed{085}",
    "\\boxed{+85}",
    "\\boxed{85.0}",
    "\\boxed{8 5}",
    "\\boxed{-7}",
    "\\boxed{7}",
    "\\boxed{85",
    "\\boxed{}",
    "85",
    "\\boxed{1}\\boxed{85}",
    "\\boxed{85}\\boxed{1}",
    "\\boxed{{85}}",
    "Answer: 85",
    "\\boxed{0}",
]


@pytest.mark.parametrize("truth", ["85", "-7", "0", "1"])
def test_is_correct_matches_the_reward_service(se, truth):
    for response in RESPONSES:
        expected = score_math(response, truth, "last_boxed")["correct"]
        assert se.is_correct(response, truth) == expected, (response, truth)


def test_rollouts_to_reach_interpolates(se):
    x = [0, 100, 200, 300]
    assert se.rollouts_to_reach(x, [0.1, 0.2, 0.4, 0.5], 0.3) == pytest.approx(150.0)
    assert se.rollouts_to_reach(x, [0.3, 0.2, 0.4, 0.5], 0.3) == 0
    assert se.rollouts_to_reach(x, [0.1, 0.2, 0.25, 0.29], 0.3) is None


def test_response_mask_keeps_the_first_eos_only(se):
    eos = 1
    resp = torch.tensor([[5, 6, eos, 0, 0], [5, 5, 5, 5, 5], [eos, 0, eos, 0, 0]])
    mask = se.response_mask(resp, eos)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


def _rollouts():
    """8 rollouts in 2 groups: left-padded prompts, responses of different lengths."""
    return rollouts([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0], [0, 0, 0, 0, 1, 1, 1, 1])


def _grads(se, model, algo, micro: int, temperature: float = 1.0) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    seq, prompt_attn, rmask, rewards, group_of = _rollouts()
    se.accumulate_gradients(
        model, seq, prompt_attn, rmask, rewards, group_of, algo, micro, temperature
    )
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _algo(modulate: bool):
    from dynamo_rl.config.learner import AlgorithmConfig, ModulationConfig, PpoLoss

    return AlgorithmConfig(
        policy_loss=PpoLoss(clip_low=0.2, clip_high=0.28, dual_clip=10.0),
        modulation=ModulationConfig(enabled=modulate),
        is_cap=None,
    )


def test_micro_batch_default_is_the_learners(se):
    from dynamo_rl.config.learner import LearnerConfig

    assert se.Settings().micro_batch == LearnerConfig.model_fields["micro_batch_size"].default


def test_update_without_modulation_does_not_depend_on_micro_batches(se, tiny):
    whole = _grads(se, tiny, _algo(False), micro=8)
    split = _grads(se, tiny, _algo(False), micro=3)
    assert whole.abs().sum() > 0
    assert torch.allclose(whole, split, rtol=1e-4, atol=1e-7)
    # The logits are divided by the sampling temperature: another temperature, another gradient.
    assert not torch.allclose(whole, _grads(se, tiny, _algo(False), micro=8, temperature=0.5))


def test_modulation_is_per_micro_batch_like_the_learner(se, tiny):
    """The update equals, micro-batch by micro-batch, dynamo_modulate + policy_loss over that
    micro-batch's tokens normalised by the whole batch — not modulation over the whole batch."""
    from learner.algorithms import (
        dynamo_modulate,
        grpo_advantages,
        policy_loss,
        token_logprobs_and_entropy,
    )

    got = _grads(se, tiny, _algo(True), micro=4)
    seq, prompt_attn, rmask, rewards, group_of = _rollouts()
    width = prompt_attn.shape[1]
    attn = torch.cat([prompt_attn, rmask], dim=1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    adv = grpo_advantages(rewards, torch.tensor(group_of))[:, None] * rmask
    norm = float(rmask.sum())
    tiny.zero_grad(set_to_none=True)
    for sl in (slice(0, 4), slice(4, 8)):
        logits = tiny(input_ids=seq[sl], attention_mask=attn[sl], position_ids=pos[sl]).logits
        logp, ent = token_logprobs_and_entropy(logits[:, width - 1 : -1], seq[sl, width:])
        a, _ = dynamo_modulate(
            adv[sl], logp.detach(), logp.detach(), ent.detach(), rmask[sl],
            clip_low=0.2, clip_high=0.28,
        )  # fmt: skip
        loss, _ = policy_loss(
            logp, logp.detach(), a, rmask[sl], clip_low=0.2, clip_high=0.28, dual_clip=10.0,
            normalizer=norm,
        )  # fmt: skip
        loss.backward()
    want = torch.cat([p.grad.flatten() for p in tiny.parameters() if p.grad is not None])
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)
    assert not torch.allclose(got, _grads(se, tiny, _algo(True), micro=8), rtol=1e-3)
