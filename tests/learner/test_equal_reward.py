"""No silent zeros: a run whose rewards are all equal step after step says so — a warning in the
log, ``equal_reward_streak``/``equal_reward_warning`` in the step log (the dashboard draws the
streak), and a counter — within ``learner.equal_reward_warn_steps`` steps. A real torchrun learner
on a tiny model, fed by a real Redis stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamo_rl.codec import TrajectoryGroup
from dynamo_rl.notices import read_notices
from learner.metrics import LearnerMetrics
from learner.steplog import read_log
from learner.tiny_model import build_tiny_model
from tests.learner.helpers import base_overrides, make_groups, run_learner, write_groups


def _all(groups: list[TrajectoryGroup], reward: float) -> list[TrajectoryGroup]:
    for g in groups:
        for r in g.responses:
            r.reward, r.correct = reward, reward > 0
    return groups


def test_a_warning_bumps_the_counter() -> None:
    m = LearnerMetrics()
    m.record_step({"step": 1, "equal_reward_streak": 1, "equal_reward_warning": False})
    m.record_step({"step": 2, "equal_reward_streak": 2, "equal_reward_warning": True})
    text = m.metrics.exposition().decode()
    assert "dynamo_learner_equal_reward_warnings_total 1.0" in text
    assert "dynamo_learner_equal_reward_streak 2.0" in text


@pytest.mark.slow
def test_all_zero_rewards_warn_within_k_steps(redis_url: str, tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1)  # fmt: skip
    # Two groups per step: zero, zero (warned at K = 2), zero again (streak 3, no second warning
    # until 4), mixed (the streak ends), all one (equal too: a new streak).
    groups = [*_all(make_groups(6, seed=1), 0.0), *make_groups(2, seed=2),
              *_all(make_groups(2, seed=3), 1.0)]  # fmt: skip
    write_groups(redis_url, "zeros", groups)
    overrides = base_overrides(model, tmp_path / "run", redis_url, "zeros")
    log = tmp_path / "learner.log"
    run_learner(1, [*overrides, "learner.train_batch_size=2", "learner.max_steps=5",
                    "learner.equal_reward_warn_steps=2"], log)  # fmt: skip
    steps = read_log(tmp_path / "run" / "metrics.jsonl")
    assert [r["equal_reward_streak"] for r in steps] == [1, 2, 3, 0, 1]
    assert [r["equal_reward_warning"] for r in steps] == [False, True, False, False, False]
    assert [r["rewards_all_equal"] for r in steps] == [True, True, True, False, True]
    warnings = [x for x in log.read_text().splitlines() if "no learning signal" in x]
    assert len(warnings) == 1 and "2 train steps in a row with every reward 0" in warnings[0]
    # ... and once in the run folder, for up's console and the dashboard (dynamo_rl.notices).
    (notice,) = read_notices(tmp_path / "run")
    assert (notice.service, notice.kind) == ("learner", "no_signal")
    assert notice.message.startswith("2 train steps in a row with every reward 0: no learning")
