"""The learner's staleness bound holds per token: a group whose responses span weight versions
(``rollout.update_mode=interrupt``) is as old as its oldest token, whatever its group-level
version says; the step log shows the spread of versions within responses. A real learner process
pushes to a real engine between its steps (so its version moves), reading groups from Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamo_rl.codec import Response, TrajectoryGroup
from learner.steplog import read_log
from learner.tiny_model import build_tiny_model
from tests.learner.helpers import base_overrides, run_learner, write_groups
from tests.services.engine.engine_util import running_engine

pytestmark = pytest.mark.slow


def group(name: str, version: int, token_versions: list[list[int]]) -> TrajectoryGroup:
    """A group of one response per ``token_versions`` entry, half right, half wrong."""
    responses = [
        Response(
            token_ids=[10 + k for k in range(len(vs))],
            logprobs=[-5.5] * len(vs),
            reward=float(i % 2),
            correct=bool(i % 2),
            finish_reason="stop",
            weight_versions=vs,
        )
        for i, vs in enumerate(token_versions)
    ]
    return TrajectoryGroup(
        prompt_id=name, prompt_token_ids=[5, 6, 7], responses=responses, weight_version=version
    )


def test_staleness_bound_counts_from_the_oldest_token(redis_url: str, tmp_path: Path) -> None:
    name = "token-staleness"
    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1)
    # Step 1 (learner at version 0): responses that span 0 -> 1 are within max_staleness 0.
    # Step 2 (after the push of version 1): a group labelled 1 whose token 0 was sampled at
    # version 0 is stale; two groups wholly at version 1 are trained.
    write_groups(redis_url, name, [
        group("a", 0, [[0, 0, 1], [0, 0, 0]]),
        group("b", 0, [[0, 0], [0, 1]]),
        group("spans", 1, [[0, 1, 1], [1, 1, 1]]),
        group("c", 1, [[1, 1], [1, 1, 1]]),
        group("d", 1, [[1, 1, 1], [1, 1]]),
    ])  # fmt: skip
    with running_engine(
        model, tmp_path / "engine", f"endpoints.redis_url={redis_url}", f"run.name={name}"
    ):
        run_learner(1, [
            *base_overrides(model, tmp_path / "run", redis_url, name),
            "learner.train_batch_size=2",
            "learner.mini_batch_size=2",
            "learner.max_steps=2",
            "learner.push.every=1",
            "learner.stream.max_staleness=0",
        ], tmp_path / "learner.log")  # fmt: skip
    first, second = read_log(tmp_path / "run" / "metrics.jsonl")
    assert first["weight_version"] == 1 and first["groups_skipped"] == 0
    assert first["staleness_max"] == 0
    assert first["version_spread_max"] == 1 and first["version_spread_mean"] == 0.5
    assert second["groups_skipped"] == 1 and second["groups"] == 2
    assert second["staleness_max"] == 0 and second["version_spread_max"] == 0
