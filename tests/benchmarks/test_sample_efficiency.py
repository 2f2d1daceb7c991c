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


def test_response_norms_equal_a_per_token_autograd_loop(se, tiny):
    """The grad methods' statistic, measured in the update's own backward (micro-batches of 3,
    temperature 0.7, prompt-mean), equals s_j = normaliser · Σ_t |∂loss/∂logp_t| · ‖∂logp_t/∂W‖
    with both factors taken by autograd, token by token (W: the LM head's weight)."""
    from dynamo_rl.config.learner import AlgorithmConfig, PpoLoss
    from learner.algorithms import grpo_advantages, token_logprobs_and_entropy
    from learner.grad_report import lm_head_of
    from learner.objective import ObjectiveInputs, rl_objective

    algo = AlgorithmConfig(
        policy_loss=PpoLoss(clip_low=0.2, clip_high=0.28), agg="prompt-mean", is_cap=None
    )
    seq, prompt_attn, rmask, rewards, group_of = _rollouts()
    got = torch.zeros(len(group_of))
    tiny.zero_grad(set_to_none=True)
    se.accumulate_gradients(
        tiny, seq, prompt_attn, rmask, rewards, group_of, algo, 3, 0.7, response_norms=got
    )
    tiny.zero_grad(set_to_none=True)

    width, tau = prompt_attn.shape[1], 0.7
    attn = torch.cat([prompt_attn, rmask], dim=1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    head = lm_head_of(tiny)
    hidden = []
    hook = head.register_forward_hook(lambda _m, args, _o: hidden.append(args[0].detach()))
    logits = tiny(input_ids=seq, attention_mask=attn, position_ids=pos).logits
    hook.remove()
    logp, ent = token_logprobs_and_entropy(logits[:, width - 1 : -1] / tau, seq[:, width:])
    gids = torch.tensor(group_of)
    from learner.algorithms import group_token_counts

    norm = 2.0  # prompt-mean: the batch's number of groups
    loss = rl_objective(
        ObjectiveInputs(
            logp=logp,
            old_logp=logp.detach(),
            advantages=grpo_advantages(rewards, gids)[:, None] * rmask,
            mask=rmask,
            entropy=ent,
            group_tokens=group_token_counts(gids, rmask),
        ),
        algo,
        normalizer=norm,
    ).loss
    (coef,) = torch.autograd.grad(loss, logp)
    w = head.weight.detach().clone().requires_grad_(True)
    h = hidden[0][:, width - 1 : -1]
    own = torch.log_softmax((h @ w.T) / tau, dim=-1)
    want = torch.zeros(len(group_of))
    for j in range(len(group_of)):
        for t in range(int(rmask[j].sum())):
            (g,) = torch.autograd.grad(own[j, t, seq[j, width + t]], w, retain_graph=True)
            want[j] += norm * coef[j, t].abs() * g.norm()
    assert want.abs().sum() > 0
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), (got, want)


def test_summary_pairs_every_method_with_the_named_baseline(se):
    """Rollouts to the target are paired seed by seed with ``baseline``: their differences and
    ratios over the seeds where both reached it; the target is set by the baseline's gain."""

    def run(method, seed, ys):
        curve = [{"rollouts": 100 * i, "sampled": y, "greedy": y} for i, y in enumerate(ys)]
        return {
            "method": method,
            "seed": seed,
            "curve": curve,
            "final_full": {"sampled": ys[-1], "greedy": ys[-1]},
            "zero_adv_rollouts": 0,
            "rollouts": 300,
        }

    runs = [
        run("uniform", 0, [0.1, 0.2, 0.3, 0.5]),
        run("uniform", 1, [0.1, 0.1, 0.3, 0.5]),
        run("grad-wide", 0, [0.1, 0.3, 0.5, 0.5]),
        run("grad-wide", 1, [0.1, 0.2, 0.3, 0.3]),
    ]
    out = se.summarise(runs, ["uniform", "grad-wide"], "sampled", 0.375, baseline="uniform")
    assert out["baseline"] == "uniform"
    assert out["target"] == pytest.approx(0.25)  # 0.1 + 0.375 × (0.5 − 0.1): uniform's gain
    g = out["methods"]["grad-wide"]
    assert g["rollouts_to_target_per_seed"] == pytest.approx([75.0, 150.0])
    ratio = g["paired_rollouts_to_target_ratio"]
    assert ratio["seeds"] == [0, 1]
    assert ratio["mean"] == pytest.approx((75 / 150 + 150 / 175) / 2)
    assert g["paired_rollouts_to_target_diff"]["mean"] == pytest.approx(-50.0)
    assert g["paired_final_diff"]["mean"] == pytest.approx(-0.1)
    assert out["methods"]["uniform"]["paired_rollouts_to_target_ratio"]["mean"] == 1.0
