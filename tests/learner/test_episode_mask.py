"""Multi-turn samples in the learner: the loss mask through the learner's own plumbing
(``learner.step``: ``plan_batch``, ``normalizer``, ``batch_advantages``, the step's old pass) and
``rl_objective``, against a
plain-Python loop twin that visits model tokens only."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from dynamo_rl.config.learner import (
    AlgorithmConfig,
    DapoConfig,
    KlConfig,
    LearnerConfig,
    PpoLoss,
)
from learner.batch import Sample
from learner.objective import ObjectiveInputs, rl_objective
from learner.step import RLStep, batch_advantages, normalizer, plan_batch

PPO = PpoLoss(clip_low=0.2, clip_high=0.28)


def episode_samples(seed: int) -> list[Sample]:
    """Two groups of episodes: model turns (mask 1) with observations (mask 0) between them,
    one single-turn sample (no mask) among them."""
    gen = torch.Generator().manual_seed(seed)
    masks = [
        [1, 1, 0, 0, 0, 1, 1, 1],
        [1, 0, 0, 1],
        None,  # a single-turn response: every token trained
        [1, 1, 1, 0, 0, 0, 0, 1],
    ]
    out = []
    for i, m in enumerate(masks):
        n = len(m) if m is not None else 5
        out.append(
            Sample(
                prompt=[5, 6, 7],
                response=torch.randint(3, 50, (n,), generator=gen).tolist(),
                sampling_logprobs=(-torch.rand(n, generator=gen)).tolist(),
                reward=float(i % 2),
                correct=bool(i % 2),
                group=i // 2,
                loss_mask=m,
            )
        )
    return out


def loop_loss(samples: list[Sample], lp, old, ref, ent, adv, kl_coef: float, ent_coef: float):
    """token-mean of PPO-clip + k3 KL − entropy over model tokens only."""
    total, n = 0.0, 0
    for i, s in enumerate(samples):
        for k, m in enumerate(s.trained()):
            if not m:
                continue
            r = math.exp(lp[i][k] - old[i][k])
            a = adv[i]
            pg = max(-a * r, -a * min(max(r, 0.8), 1.28))
            d = lp[i][k] - ref[i][k]
            total += pg + kl_coef * (math.exp(-d) + d - 1) - ent_coef * ent[i][k]
            n += 1
    return total / n


@pytest.mark.parametrize("seed", range(3))
def test_mask_applies_to_policy_kl_entropy_and_normaliser(seed: int) -> None:
    samples = episode_samples(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    lp = [(-torch.rand(len(s.response), generator=gen) * 2).tolist() for s in samples]
    old = [[x + 0.3 * float(torch.randn(1, generator=gen)) for x in row] for row in lp]
    ref = [[x + 0.2 * float(torch.randn(1, generator=gen)) for x in row] for row in lp]
    ent = [(torch.rand(len(s.response), generator=gen) * 3).tolist() for s in samples]
    adv = [float(torch.randn(1, generator=gen)) for _ in samples]
    algo = AlgorithmConfig(policy_loss=PPO, kl=KlConfig(coef=0.1, kind="k3"), entropy_coef=0.01)
    lc = SimpleNamespace(mini_batch_size=2, train_batch_size=2, micro_batch_size=4)
    minis, plan = plan_batch(samples, lc, pad_id=0)
    [rows], [[mb]] = minis, plan
    norm = normalizer(samples, rows, "token-mean")
    assert norm == sum(s.model_tokens for s in samples) == 5 + 2 + 5 + 4

    def pad(rows_: list[list[float]]) -> torch.Tensor:
        t = torch.full(mb.mask.shape, 7.0)  # garbage everywhere a mask is 0
        for j, i in enumerate(mb.rows):
            t[j, : len(rows_[i])] = torch.tensor(rows_[i])
        return t

    a = torch.tensor([adv[i] for i in mb.rows])[:, None].expand_as(mb.mask).clone()
    out = rl_objective(
        ObjectiveInputs(
            logp=pad(lp), old_logp=pad(old), advantages=a, mask=mb.mask,
            entropy=pad(ent), ref_logp=pad(ref),
        ),
        algo,
        normalizer=norm,
    )  # fmt: skip
    assert out.loss.item() == pytest.approx(loop_loss(samples, lp, old, ref, ent, adv, 0.1, 0.01),
                                            rel=1e-5)  # fmt: skip
    # The collated mask is 0 exactly at observation tokens and padding.
    for j, i in enumerate(mb.rows):
        n = len(samples[i].response)
        assert mb.mask[j, :n].tolist() == samples[i].trained()
        assert not mb.mask[j, n:].any()


def test_overlong_penalty_counts_model_tokens_only() -> None:
    """DAPO's overlong shaping sees 4 model tokens, not the 8 tokens of the sample."""
    s = Sample(prompt=[5], response=[9] * 8, sampling_logprobs=[-1.0] * 8, reward=1.0,
               correct=True, group=0, loss_mask=[1, 1, 0, 0, 0, 0, 1, 1])  # fmt: skip
    algo = AlgorithmConfig(
        policy_loss=PPO,
        dapo=DapoConfig(overlong_buffer=2, max_response_len=6),
        advantage={"type": "drgrpo"},
    )
    lc = SimpleNamespace(algorithm=algo, critic=SimpleNamespace(enabled=False))
    rewards, lengths, _ = batch_advantages([s], [], lc)
    assert lengths.tolist() == [4]
    assert rewards.tolist() == [1.0]  # 4 <= 6 - 2: no penalty (8 tokens would get -1)


def test_step_record_counts_turns_tool_calls_and_errors_of_episodes() -> None:
    """From the stream's responses (through the codec) to the step record's tool figures."""
    from dynamo_rl.codec import (
        Response,
        ToolCall,
        TrajectoryGroup,
        Turn,
        decode_group,
        encode_group,
    )
    from learner.batch import episode_stats, samples_from_groups

    ok, bad = ToolCall(name="calculator"), ToolCall(name="calculator", error="failed")

    def episode(turns: list[Turn]) -> Response:
        mask = [int(any(t.start <= k < t.end for t in turns)) for k in range(4)]  # model tokens
        return Response(
            token_ids=[5, 6, 7, 8],
            logprobs=[-1.0, 0.0, 0.0, -0.5],
            loss_mask=mask,
            turns=turns,
        )

    g = TrajectoryGroup(
        prompt_id="p",
        prompt_token_ids=[1, 2],
        responses=[
            episode(
                [
                    Turn(start=0, end=1, observation_end=3, tool_calls=[ok, bad]),
                    Turn(start=3, end=4, observation_end=4),
                ]
            ),
            episode(
                [
                    Turn(start=0, end=1, observation_end=3, tool_calls=[ok]),
                    Turn(start=3, end=4, observation_end=4, tool_calls=[bad]),
                ]
            ),
            episode([Turn(start=0, end=4, observation_end=4)]),
        ],
    )
    samples = samples_from_groups([decode_group(encode_group(g))], 0)
    assert [(s.turns, s.tool_calls, s.tool_errors) for s in samples] == [
        (2, 2, 1),
        (2, 2, 1),
        (1, 0, 0),
    ]
    assert episode_stats(samples) == {
        "episode_turns_mean": pytest.approx(5 / 3),
        "tool_call_rate": pytest.approx(2 / 3),
        "tool_calls_mean": pytest.approx(4 / 3),
        "tool_error_rate": 0.5,
    }
    single = TrajectoryGroup(
        prompt_id="q", prompt_token_ids=[1], responses=[Response(token_ids=[5], logprobs=[-1.0])]
    )
    assert episode_stats(samples_from_groups([single], 0)) == {}  # single-turn: no figures


def test_the_mask_ablation_trains_the_observation_tokens() -> None:
    """``learner.algorithm.train_observations``: every response token is trained — the mask,
    the normaliser and the loss's gradient reach the observation tokens — and those tokens,
    which the engine never sampled, get importance weight 1 after the learner's old pass."""
    from dataclasses import replace

    samples = [replace(s, observations_trained=True) for s in episode_samples(0)]
    plain = episode_samples(0)
    assert sum(s.model_tokens for s in samples) == sum(len(s.response) for s in samples) == 25
    assert sum(s.model_tokens for s in plain) == 16  # without the ablation
    lc = LearnerConfig(mini_batch_size=4, train_batch_size=4, micro_batch_size=4)
    _, [[mb]] = plan_batch(samples, lc, pad_id=0)
    observation = torch.zeros_like(mb.mask)
    for j, i in enumerate(mb.rows):
        s = samples[i]
        assert mb.mask[j, : len(s.response)].tolist() == [1.0] * len(s.response)
        if s.loss_mask is not None:
            observation[j, : len(s.response)] = 1 - torch.tensor(s.loss_mask, dtype=torch.float)
    assert observation.sum() == 9 and torch.equal(mb.unsampled, observation)
    _, [[plain_mb]] = plan_batch(plain, lc, pad_id=0)
    assert plain_mb.unsampled is None and not (plain_mb.mask * observation).any()

    # The old pass: the observation tokens' sampling log-probs become the learner's own.
    old = -torch.rand(mb.mask.shape) - 0.1
    step = RLStep(lc, torch.nn.Linear(1, 1), None, pad_id=0,
                  forward=lambda _model, _mb, _grad: (old, torch.zeros_like(old), None))  # fmt: skip
    step._old_pass([[mb]])
    assert torch.equal(mb.sampling_logprobs[observation == 1], old[observation == 1])
    kept = (observation == 0) & (mb.mask == 1)
    assert not torch.equal(mb.sampling_logprobs[kept], old[kept])

    # The loss's gradient reaches the observation tokens.
    logp = old.clone().requires_grad_(True)
    adv = torch.ones_like(mb.mask)
    out = rl_objective(
        ObjectiveInputs(logp=logp, old_logp=old, advantages=adv, mask=mb.mask),
        AlgorithmConfig(policy_loss=PPO),
        normalizer=float(mb.mask.sum()),
    )
    out.loss.backward()
    assert (logp.grad[observation == 1] != 0).all()
