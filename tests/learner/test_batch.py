"""Batch layout and sharding: padding puts every response in the last T columns; rank shares
cover a mini-batch exactly once; every rank runs the same number of micro-batches."""

from __future__ import annotations

import pytest
import torch

from dynamo_rl.codec import Response, SamplingRecord, TrajectoryGroup
from dynamo_rl.config import ConfigError, load_config
from learner.algorithms import token_logprobs_and_entropy
from learner.batch import (
    Sample,
    batch_mask,
    collate,
    micro_splits,
    mini_batches,
    num_micro,
    rank_share,
    samples_from_groups,
    scale_by_temperature,
)
from learner.trainer import lr_factor


def _sample(prompt: list[int], response: list[int], group: int) -> Sample:
    return Sample(prompt, response, [-1.0] * len(response), 1.0, True, group)


def test_collate_left_pads_prompts_and_right_pads_responses() -> None:
    samples = [_sample([5, 6, 7], [8, 9], 0), _sample([5], [10, 11, 12], 0), _sample([4], [], 1)]
    mb = collate(samples, [0, 1, 2], pad_id=0)
    assert mb.input_ids.tolist() == [
        [5, 6, 7, 8, 9, 0],
        [0, 0, 5, 10, 11, 12],
        [0, 0, 4, 0, 0, 0],
    ]
    assert mb.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1],
        [0, 0, 1, 0, 0, 0],
    ]
    assert mb.response_ids.tolist() == [[8, 9, 0], [10, 11, 12], [0, 0, 0]]
    assert mb.mask.tolist() == [[1, 1, 0], [1, 1, 1], [0, 0, 0]]
    assert mb.num_tokens == 5
    assert batch_mask(samples).tolist() == mb.mask.tolist()
    dummy = collate(samples, [], pad_id=0)
    assert dummy.num_tokens == 0 and dummy.response_len == 1


def test_each_group_keeps_its_sampling_temperature() -> None:
    def group(sampling: SamplingRecord | None) -> TrajectoryGroup:
        g = TrajectoryGroup(prompt_token_ids=[5], responses=[Response(token_ids=[6], logprobs=[0])])
        if sampling is not None:
            g.sampling.CopyFrom(sampling)
        return g

    groups = [
        group(SamplingRecord(temperature=0.7)),
        group(None),  # unset: the model's own distribution
        group(SamplingRecord(temperature=0.0)),  # greedy: no tempered distribution, raw one
        group(SamplingRecord(temperature=1.3)),
    ]
    samples = samples_from_groups(groups, 0)
    assert [s.temperature for s in samples] == pytest.approx([0.7, 1.0, 1.0, 1.3])
    mb = collate(samples, [0, 1, 2, 3], pad_id=0)
    assert mb.temperature.tolist() == pytest.approx([0.7, 1.0, 1.0, 1.3])
    assert collate(samples, [], pad_id=0).temperature.tolist() == [1.0]


def test_scale_by_temperature_is_per_row() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 11, generator=gen)
    temps = torch.tensor([0.5, 1.0, 2.0])
    tokens = torch.randint(0, 11, (3, 4), generator=gen)
    logp, ent = token_logprobs_and_entropy(scale_by_temperature(logits.clone(), temps), tokens)
    for b, t in enumerate(temps.tolist()):
        want = torch.log_softmax(logits[b] / t, -1)
        assert torch.allclose(logp[b], want.gather(-1, tokens[b, :, None])[:, 0], atol=1e-6)
        assert torch.allclose(ent[b], -(want.exp() * want).sum(-1), atol=1e-5)
    ones = logits.clone()
    assert scale_by_temperature(ones, torch.ones(3)) is ones


@pytest.mark.parametrize("world", [1, 2, 3])
def test_rank_shares_partition_and_micro_counts_agree(world: int) -> None:
    samples = [_sample([1], [2] * (1 + i % 3), i // 3) for i in range(11)]
    minis = mini_batches(samples, groups_per_mini=2)
    assert [len(m) for m in minis] == [6, 5]  # whole groups of three (the last one short)
    for rows in minis:
        shares = [rank_share(rows, r, world) for r in range(world)]
        assert [i for s in shares for i in s] == rows
        n = num_micro(rows, world, micro=2)
        for share in shares:
            splits = micro_splits(share, 2, n)
            assert len(splits) == n and [i for s in splits for i in s] == share


def test_lr_schedule() -> None:
    assert [lr_factor(s, 2, "constant", None, 0.0) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    cos = [lr_factor(s, 0, "cosine", 10, 0.1) for s in (0, 5, 10, 20)]
    assert cos[0] == pytest.approx(1.0) and cos[1] == pytest.approx(0.55)
    assert cos[2] == pytest.approx(0.1) and cos[3] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["learner.algorithm.policy_loss.type=gspo", "learner.algorithm.policy_loss.dual_clip=3",
          "learner.algorithm.agg=seq-mean-token-mean"], "dual_clip is not available"),
        (["learner.algorithm.advantage.type=gae"], "needs learner.critic.enabled"),
        (["learner.critic.enabled=true"], "only used by advantage type 'gae'"),
        (["learner.algorithm.kl.in_reward_coef=0.1"], "needs advantage type 'gae'"),
        (["learner.algorithm.policy_loss.type=gspo"], "seq-mean-token-mean"),
        (["learner.algorithm.advantage.type=ppo"], "'grpo', 'drgrpo', 'rloo'"),
        (["learner.mini_batch_size=64"], "must be <= learner.train_batch_size"),
        (["learner.optim.schedule=cosine"], "needs learner.optim.total_steps"),
        (["learner.algorithm.dapo.overlong_buffer=16"], "needs dapo.max_response_len"),
        (["learner.algorithm.agg=mean"], "'token-mean'"),
    ],
)  # fmt: skip
def test_nonsense_combinations_are_rejected(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match="learner") as info:
        load_config(overrides=overrides, env={})
    assert expected in str(info.value)


def test_variant_fields_without_type_tune_the_default() -> None:
    cfg = load_config(overrides=["learner.algorithm.policy_loss.clip_high=0.28"], env={})
    assert cfg.learner.algorithm.policy_loss.type == "ppo"
    assert cfg.learner.algorithm.policy_loss.clip_high == pytest.approx(0.28)
