"""The sample-efficiency benchmark's own logic: its scorer shortcut agrees with the reward service,
a generated batch becomes the learner step's samples, and its summary arithmetic (rollouts to a
target, response masks) is right. Its update is the learner's step: ``tests/learner/test_step.py``
and ``test_learner_path.py``."""

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


def test_micro_batch_default_is_the_learners(se):
    from dynamo_rl.config.learner import LearnerConfig

    assert se.Settings().micro_batch == LearnerConfig.model_fields["micro_batch_size"].default


def test_a_generated_batch_becomes_the_steps_samples(se):
    """Each row a sample of its group: the prompt without its left padding, the response up to
    and including EOS with a sampling log-prob per token, its reward; greedy (temperature 0)
    trains on the untempered distribution."""
    seq, prompt_attn, rmask, rewards, group_of = rollouts(
        [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0], [0, 0, 0, 0, 1, 1, 1, 1]
    )
    logp = -torch.arange(seq.shape[0] * 6, dtype=torch.float32).reshape(-1, 6) / 10
    batch = se.rl_batch(seq, 5, prompt_attn, rmask, logp, rewards, group_of, ["7", "9"], 0.0)
    assert batch.prompt_ids == ["7", "9"] and batch.groups == 2
    for j, smp in enumerate(batch.samples):
        n = int(rmask[j].sum())
        assert smp.prompt == seq[j, :5][prompt_attn[j].bool()].tolist()
        assert len(smp.prompt) == (3 if j % 2 == 0 else 5)
        assert smp.response == seq[j, 5 : 5 + n].tolist()
        assert smp.sampling_logprobs == logp[j, :n].tolist()
        assert (smp.group, smp.reward, smp.correct) == (group_of[j], rewards[j], rewards[j] > 0)
        assert smp.temperature == 1.0


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
