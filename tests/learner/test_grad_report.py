"""The learner's gradient statistic against a per-sample autograd loop twin: each token's
output-layer gradient norm, each response's statistic from the backward the step runs anyway,
and the per-prompt reduction; and the collector leaves the step's gradients as they were."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from learner.batch import Sample, collate
from learner.grad_report import GradStatsCollector, lm_head_of
from learner.step import policy_forward
from learner.tiny_model import build_tiny_model

pytestmark = pytest.mark.usefixtures("one_rank")  # records() gathers over the ranks


def _samples() -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for j in range(6):
        group = j // 3
        length = 3 + j % 3
        out.append(
            Sample(
                prompt=torch.randint(3, 200, (4 + j % 2,), generator=gen).tolist(),
                response=torch.randint(3, 200, (length,), generator=gen).tolist(),
                sampling_logprobs=[-5.0] * length,
                reward=float(j % 2) if group == 0 else 1.0,  # group 1: zero advantage
                correct=False,
                group=group,
                temperature=0.7 if j % 2 else 1.0,
            )
        )
    return out


def _loss(logp, mask, normalizer):
    """A nonlinear loss, so every token's ∂loss/∂logp differs."""
    adv = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0, -1.0])[:, None]
    return ((-adv * logp + 0.3 * logp.square()) * mask).sum() / normalizer


def test_statistic_matches_per_sample_autograd(policy) -> None:
    samples = _samples()
    mb = collate(samples, list(range(len(samples))), pad_id=0)
    norm, scale = 7.0, 2.0
    collector = GradStatsCollector(policy)
    policy.zero_grad(set_to_none=True)
    with collector.watch(mb):
        logp, _, _ = policy_forward(policy, mb)
    collector.track(logp, mb, norm, scale)
    (_loss(logp, mb.mask, norm) * scale).backward()
    with_collector = [p.grad.clone() for p in policy.parameters()]

    # The twin: per sample and token, autograd of log p(y_t) w.r.t. a copy of the LM head's weight
    # at the same hidden state, and ∂loss/∂logp from a plain autograd.grad.
    head = lm_head_of(policy)
    hidden = []
    handle = head.register_forward_hook(lambda _m, a, _o: hidden.append(a[0].detach()))
    policy.zero_grad(set_to_none=True)
    logp2, _, _ = policy_forward(policy, mb)
    handle.remove()
    (coef,) = torch.autograd.grad(_loss(logp2, mb.mask, norm), logp2, retain_graph=True)
    (_loss(logp2, mb.mask, norm) * scale).backward()
    for a, b in zip(with_collector, policy.parameters(), strict=True):
        assert torch.equal(a, b.grad)  # the hooks read the gradient, never change it
    weight = head.weight.detach()
    want = []
    for j, s in enumerate(samples):
        total = 0.0
        for t in range(mb.response_len):
            if not mb.mask[j, t]:
                continue
            w = weight.clone().requires_grad_(True)
            z = hidden[0][j, t] @ w.T / s.temperature
            (g,) = torch.autograd.grad(torch.log_softmax(z, -1)[mb.response_ids[j, t]], w)
            total += abs(float(coef[j, t])) * float(g.norm())
        want.append(total * norm)
    got = [collector.norms[j] for j in range(len(samples))]
    assert got == pytest.approx(want, rel=1e-4)
    assert all(v > 0 for v in want[:5])  # row 3 has advantage 0 but a nonzero square term

    records = collector.records(samples, ["p0", "p1"])
    for rec, rows in zip(records, ([0, 1, 2], [3, 4, 5]), strict=True):
        u = [3 * want[r] for r in rows]  # n·s_j with n = 3 responses per group
        assert rec.mean == pytest.approx(sum(u) / 3, rel=1e-4)
        assert rec.spread == pytest.approx(math.sqrt(sum(x * x for x in u) / 3), rel=1e-4)
    assert [r.prompt_id for r in records] == ["p0", "p1"]
    assert [r.zero_advantage for r in records] == [False, True]


def test_a_model_without_lm_head_is_refused() -> None:
    with pytest.raises(ValueError, match="no lm_head module"):
        lm_head_of(torch.nn.Linear(2, 2))


@pytest.mark.slow
def test_the_learner_writes_each_prompts_statistic_to_redis(redis_url: str, tmp_path: Path) -> None:
    """A real learner (torchrun, one rank) with ``allocator.method=grad`` writes every trained
    prompt's statistic at its weight version, and its step records carry the cost."""
    import redis

    from dynamo_rl.contracts import gradstats
    from learner.steplog import read_log
    from tests.learner.helpers import base_overrides, make_groups, run_learner, write_groups

    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1)  # fmt: skip
    write_groups(redis_url, "gs", make_groups(4, seed=1) * 2)
    overrides = base_overrides(model, tmp_path / "run", redis_url, "gs")
    run_learner(1, [*overrides, "learner.train_batch_size=4", "learner.max_steps=2",
                    "allocator.method=grad"], tmp_path / "learner.log")  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    try:
        got = gradstats.read(client, "gs", ["p0", "p1", "p2", "p3", "p9"])
    finally:
        client.close()
    assert (got.spread[:4] > 0).all() and np.isnan(got.spread[4])
    assert (got.mean[:4] > 0).all() and (got.mean[:4] <= got.spread[:4] + 1e-9).all()
    assert got.version[:4].tolist() == [0.0] * 4  # no push: weight version 0
    assert got.streak[:4].tolist() == [0.0] * 4  # every group had a signal
    records = read_log(tmp_path / "run" / "metrics.jsonl")
    assert [r["grad_stats_prompts"] for r in records] == [4, 4]
    assert all(len(r["grad_alloc"]) == 4 and r["grad_var_ratio"] > 0 for r in records)
    assert all(0 < r["time_grad_stats"] < r["time_step"] for r in records)


def test_step_fields_estimate_the_variance_against_uniform() -> None:
    from dynamo_rl.contracts.gradstats import GradRecord
    from learner.grad_report import step_fields

    records = [GradRecord("a", 1.0, 3.0, False), GradRecord("b", 1.0, 1.0, False)]
    records.append(GradRecord("c", 0.0, 0.0, True))
    fields = step_fields(records, [12, 4, 8])  # n̄ = 8
    want = (9 / 12 + 1 / 4) / ((9 + 1) / 8)  # Σ s²/n ÷ Σ s²/n̄
    assert fields["grad_var_ratio"] == pytest.approx(want)
    assert fields["grad_alloc"] == [[12, 3.0], [4, 1.0], [8, 0.0]]
    assert fields["grad_alloc_corr"] == pytest.approx(
        float(np.corrcoef([12, 4, 8], [3, 1, 0])[0, 1])
    )
    assert fields["grad_zero_adv_share"] == pytest.approx(1 / 3)
    assert step_fields(records, [8, 8, 8])["grad_var_ratio"] == pytest.approx(1.0)
    assert step_fields([], []) == {}
