"""On-policy distillation in the learner (``learner/opd.py``): the ``opd`` advantage
−(log π_student − log π_teacher), its mix with the outcome advantage through the step's own
``batch_advantages``, and the step record's ``opd_reverse_kl`` — each against a plain-Python loop
twin; teacher log-probs read from the stream's protobuf into samples."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from dynamo_rl.config.learner import AlgorithmConfig, OpdConfig
from learner.algorithms import opd_advantages
from learner.batch import Sample
from learner.opd import opd_record
from learner.step import batch_advantages

GROUPS = [0, 0, 0, 1, 1]
REWARDS = [1.0, 0.0, 0.5, 1.0, 0.0]
MASKS = [None, [1, 1, 0, 0, 1], None, [1, 0, 1], None]
LENGTHS = [4, 5, 2, 3, 6]


def samples(seed: int = 0, teacher: bool = True) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for g, r, m, n in zip(GROUPS, REWARDS, MASKS, LENGTHS, strict=True):
        out.append(
            Sample(
                prompt=[1, 2], response=[rng.randrange(3, 50) for _ in range(n)],
                sampling_logprobs=[-rng.uniform(0, 4) for _ in range(n)],
                teacher_logprobs=[-rng.uniform(0, 4) for _ in range(n)] if teacher else None,
                reward=r, correct=r > 0, group=g, loss_mask=m,
            )
        )  # fmt: skip
    return out


def loop_opd(s: Sample) -> list[float]:
    """The opd advantage of each token of ``s``, trained tokens only (0 elsewhere)."""
    assert s.teacher_logprobs is not None
    out = []
    for w, lp, tlp in zip(s.trained(), s.sampling_logprobs, s.teacher_logprobs, strict=True):
        out.append(-(lp - tlp) if w else 0.0)
    return out


def loop_drgrpo(batch: list[Sample]) -> list[float]:
    out = []
    for s in batch:
        group = [t.reward for t in batch if t.group == s.group]
        out.append(s.reward - sum(group) / len(group))
    return out


def test_opd_advantages_equal_a_loop_twin() -> None:
    gen = torch.Generator().manual_seed(3)
    student = -torch.rand(4, 7, generator=gen) * 5
    teacher = -torch.rand(4, 7, generator=gen) * 5
    mask = torch.rand(4, 7, generator=gen) > 0.3
    got = opd_advantages(student, teacher, mask)
    for i in range(4):
        for t in range(7):
            want = -(student[i, t].item() - teacher[i, t].item()) if mask[i, t] else 0.0
            assert got[i, t].item() == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize(("weight", "outcome_weight"), [(1.0, 0.0), (0.5, 1.0), (2.0, 0.25)])
def test_step_mixes_opd_with_the_outcome_advantage(weight: float, outcome_weight: float) -> None:
    batch = samples()
    algo = AlgorithmConfig(
        advantage={"type": "drgrpo"},
        opd=OpdConfig(weight=weight, outcome_weight=outcome_weight),
    )
    lc = SimpleNamespace(algorithm=algo, critic=SimpleNamespace(enabled=False))
    plan_row = SimpleNamespace(rows=list(range(len(batch))), response_len=max(LENGTHS))
    batch_advantages(batch, [[plan_row]], lc)
    got = plan_row.advantages
    outcome = loop_drgrpo(batch)
    for i, s in enumerate(batch):
        opd = loop_opd(s)
        for t in range(max(LENGTHS)):
            trained = t < len(s.response) and s.trained()[t]
            want = outcome_weight * outcome[i] + weight * opd[t] if trained else 0.0
            assert got[i, t].item() == pytest.approx(want, abs=1e-5), (i, t)


def test_opd_off_leaves_the_outcome_advantage_alone() -> None:
    batch = samples()
    lc = SimpleNamespace(
        algorithm=AlgorithmConfig(advantage={"type": "drgrpo"}),
        critic=SimpleNamespace(enabled=False),
    )
    plan_row = SimpleNamespace(rows=list(range(len(batch))), response_len=max(LENGTHS))
    batch_advantages(batch, [[plan_row]], lc)
    outcome = loop_drgrpo(batch)
    for i, s in enumerate(batch):
        for t, w in enumerate(s.trained()):
            assert plan_row.advantages[i, t].item() == pytest.approx(outcome[i] * w, abs=1e-6)


def test_opd_without_teacher_logprobs_is_refused() -> None:
    batch = samples(teacher=False)
    lc = SimpleNamespace(
        algorithm=AlgorithmConfig(opd=OpdConfig(weight=1.0)),
        critic=SimpleNamespace(enabled=False),
    )
    with pytest.raises(ValueError, match=r"5 of 5 responses .* no teacher log-probs; set rollout"):
        batch_advantages(batch, [], lc)


def test_outcome_weight_without_opd_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"opd\.outcome_weight .* only used with"):
        OpdConfig(outcome_weight=0.0)


def test_reverse_kl_record_equals_a_loop_twin() -> None:
    batch = samples(seed=5)
    batch[2].teacher_logprobs = None  # a response no teacher scored does not count
    total = tokens = 0.0
    for s in batch:
        if s.teacher_logprobs is None:
            continue
        for w, lp, tlp in zip(s.trained(), s.sampling_logprobs, s.teacher_logprobs, strict=True):
            if w:
                total += lp - tlp
                tokens += 1
    assert opd_record(batch)["opd_reverse_kl"] == pytest.approx(total / tokens, rel=1e-9)
    assert opd_record(samples(teacher=False)) == {}


def test_teacher_logprobs_reach_the_samples_from_the_stream() -> None:
    from dynamo_rl.codec import Response, TrajectoryGroup, decode_group, encode_group
    from learner.batch import samples_from_groups

    g = TrajectoryGroup(
        prompt_id="p", prompt_token_ids=[1, 2],
        responses=[
            Response(token_ids=[5, 6], logprobs=[-1.0, -2.0], teacher_logprobs=[-0.5, -3.0]),
            Response(token_ids=[7], logprobs=[-1.0]),
        ],
    )  # fmt: skip
    scored, unscored = samples_from_groups([decode_group(encode_group(g))], 0)
    assert scored.teacher_logprobs == [-0.5, -3.0]
    assert unscored.teacher_logprobs is None


def test_step_record_carries_the_reverse_kl(policy) -> None:
    from dynamo_rl.config.learner import LearnerConfig, OptimConfig
    from learner.step import RLBatch, RLStep

    batch = samples(seed=2)
    lc = LearnerConfig(
        train_batch_size=2, micro_batch_size=8, optim=OptimConfig(grad_clip=None),
        algorithm=AlgorithmConfig(opd=OpdConfig(weight=1.0, outcome_weight=0.0), is_cap=None),
    )  # fmt: skip
    record = RLStep(lc, policy, None, pad_id=0)(RLBatch(batch, ["a", "b"]), update=False).record
    assert record["opd_reverse_kl"] == pytest.approx(opd_record(batch)["opd_reverse_kl"])
    assert record["opd_reverse_kl"] != 0.0
