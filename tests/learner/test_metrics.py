"""LearnerMetrics: dynamo_learner_* names fed from a step record, without importing torch."""

from __future__ import annotations

import subprocess
import sys

from learner.metrics import LearnerMetrics


def test_step_record_feeds_the_metrics() -> None:
    m = LearnerMetrics()
    m.record_step({"step": 3, "loss": -0.25, "beta_stab_mean": 0.9, "groups": 4, "tokens": 100,
                   "time_forward": 0.5, "time_step": 1.0, "update_losses": [1.0]})  # fmt: skip
    text = m.metrics.exposition().decode()
    assert "dynamo_learner_loss -0.25" in text
    assert "dynamo_learner_beta_stab_mean 0.9" in text
    assert "dynamo_learner_tokens_total 100.0" in text
    assert 'dynamo_learner_phase_seconds_count{phase="forward"} 1.0' in text
    assert all(n.startswith("dynamo_learner_") for n in m.metrics.names())


def test_metrics_module_does_not_import_torch() -> None:
    code = "import sys, learner.metrics; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
