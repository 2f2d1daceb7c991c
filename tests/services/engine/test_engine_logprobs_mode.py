"""Sampling temperature end to end: the embedded engine's default (``processed``) log-probs at
temperature 0.7 equal the learner's old log-probs from its own forward-pass code, and ``raw``
mode reports the untempered distribution instead."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dynamo_rl.codec import Response, SamplingRecord, TrajectoryGroup
from learner.batch import collate, samples_from_groups
from learner.mismatch import mismatch_record, mismatch_sums
from learner.model import load_policy
from learner.step import policy_forward
from tests.services.engine.engine_util import complete, running_engine

PROMPTS = [[10, 20, 30], [40, 41, 42, 43, 44, 45, 46]]
TEMPS = [0.7, 1.6]


def _engine(model_dir: Path, log_dir: Path, *overrides: str) -> Iterator[str]:
    with running_engine(
        model_dir, log_dir, "engine.batch_wait_ms=25", "engine.register_in_redis=false", *overrides
    ) as url:
        yield url


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _engine(model_dir, tmp_path_factory.mktemp("engine-processed"))


def _sample_groups(url: str, temps: list[float], **extra) -> list[TrajectoryGroup]:
    """One group per prompt, sampled at its own temperature, sent together (one engine batch)."""
    bodies = [
        {"prompt": p, "n": 3, "max_tokens": 16, "temperature": t, "seed": 11 + i, **extra}
        for i, (p, t) in enumerate(zip(PROMPTS, temps, strict=True))
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        futures = [
            pool.submit(complete, url, logprobs=0, return_token_ids=True, ignore_eos=True, **b)
            for b in bodies
        ]
        replies = [f.result() for f in futures]
    groups = []
    for body, r in zip(bodies, replies, strict=True):
        assert r.status_code == 200, r.text
        responses = [
            Response(token_ids=c["token_ids"], logprobs=c["logprobs"]["token_logprobs"])
            for c in r.json()["choices"]
        ]
        groups.append(
            TrajectoryGroup(
                prompt_id=str(body["seed"]),
                prompt_token_ids=body["prompt"],
                responses=responses,
                sampling=SamplingRecord(temperature=body["temperature"], max_tokens=16),
            )
        )
    return groups


@torch.no_grad()
def _learner_old_logprobs(model_dir: Path, groups: list[TrajectoryGroup]):
    """The learner's old log-probs: its batch code and forward pass, all rows in one micro-batch
    (so rows of different temperatures share it)."""
    samples = samples_from_groups(groups, weight_version=0)
    mb = collate(samples, list(range(len(samples))), pad_id=0)
    logp, _, _ = policy_forward(load_policy(str(model_dir)).eval(), mb)
    return logp, mb


def test_processed_logprobs_match_the_learner_at_temperature(engine: str, model_dir: Path) -> None:
    groups = _sample_groups(engine, TEMPS)
    logp, mb = _learner_old_logprobs(model_dir, groups)
    assert mb.temperature.tolist() == pytest.approx([0.7] * 3 + [1.6] * 3)
    tok = mb.mask.bool()
    worst = float((logp - mb.sampling_logprobs)[tok].abs().max())
    assert worst < 1e-4, worst
    # The untempered distribution is far from what was sampled: the check above has teeth.
    untempered = [replace(s, temperature=1.0) for s in samples_from_groups(groups, 0)]
    raw_mb = collate(untempered, list(range(len(untempered))), pad_id=0)
    with torch.no_grad():
        raw, _, _ = policy_forward(load_policy(str(model_dir)).eval(), raw_mb)
    assert float((raw - mb.sampling_logprobs)[tok].abs().max()) > 1e-2
    # The step's mismatch figure (k3 KL engine ‖ learner) is ~0 against the tempered forward pass
    # only: what the dashboard's mismatch chart shows for an engine that reports processed ones.
    lags = [0] * len(raw_mb.rows)
    tempered = mismatch_record(*mismatch_sums(logp, mb.sampling_logprobs, mb.mask, None, lags))
    untempered_kl = mismatch_record(*mismatch_sums(raw, mb.sampling_logprobs, mb.mask, None, lags))
    assert tempered["mismatch_kl_token_mean"] < 1e-7, tempered
    assert untempered_kl["mismatch_kl_token_mean"] > 1e-3, untempered_kl


def test_processed_logprobs_are_of_the_top_k_distribution(engine: str, model_dir: Path) -> None:
    """With top-k on, the reported log-prob is the sampled distribution's: renormalised over the
    k kept tokens, hence above the tempered full-vocabulary one."""
    groups = _sample_groups(engine, [0.7, 0.7], top_k=4)
    logp, mb = _learner_old_logprobs(model_dir, groups)
    tok = mb.mask.bool()
    gap = (mb.sampling_logprobs - logp)[tok]
    assert float(gap.min()) > 0.0
    # Renormalising over the top 4: engine = logp − log Σ_{top 4} p, computed by hand.
    model = load_policy(str(model_dir)).eval()
    with torch.no_grad():
        logits, _ = model(mb.input_ids, mb.attention_mask, mb.response_len)
    scaled = logits / 0.7
    top = scaled.topk(4, dim=-1).values
    want = scaled.gather(-1, mb.response_ids[..., None])[..., 0] - top.logsumexp(-1)
    assert float((want - mb.sampling_logprobs)[tok].abs().max()) < 1e-4


def test_raw_mode_reports_the_untempered_distribution(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    for url in _engine(
        model_dir, tmp_path_factory.mktemp("engine-raw"), "engine.logprobs_mode=raw"
    ):
        groups = _sample_groups(url, TEMPS)
    samples = samples_from_groups(groups, 0)
    for s in samples:
        s.temperature = 1.0  # what raw mode matches: the model's own distribution
    mb = collate(samples, list(range(len(samples))), pad_id=0)
    with torch.no_grad():
        logp, _, _ = policy_forward(load_policy(str(model_dir)).eval(), mb)
    tok = mb.mask.bool()
    assert float((logp - mb.sampling_logprobs)[tok].abs().max()) < 1e-4
