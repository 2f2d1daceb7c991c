"""Batch layout and sharding: padding puts every response in the last T columns; rank shares
cover a mini-batch exactly once; every rank runs the same number of micro-batches."""

from __future__ import annotations

import pytest

from dynamo_rl.config import ConfigError, load_config
from learner.batch import (
    Sample,
    batch_mask,
    collate,
    micro_splits,
    mini_batches,
    num_micro,
    rank_share,
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
