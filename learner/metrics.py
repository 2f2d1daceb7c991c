"""The learner's Prometheus metrics (``dynamo_learner_*``).

No torch here: the step record is a plain ``dict[str, float]`` that the trainer fills; this module
turns it into gauges, counters and histograms (``learner.steplog`` writes the same record as a JSON
line).
"""

from __future__ import annotations

from typing import Any

from dynamo_rl.metrics import MetricSet, ServiceMetrics, counter, gauge, histogram

# Step-record keys exported as gauges (dynamo_learner_<key>); the JSONL log keeps every key.
GAUGES: dict[str, str] = {
    "loss": "total loss of the last step (mean over its updates)",
    "policy_loss": "policy loss of the last step",
    "kl": "KL to the reference of the last step",
    "entropy": "mean token entropy of the last step",
    "grad_norm": "global gradient norm before clipping (last update)",
    "lr": "learning rate of the last step",
    "clip_frac_upper": "fraction of tokens clipped at 1 + clip_high",
    "clip_frac_lower": "fraction of tokens clipped at 1 - clip_low (or dual-clip)",
    "approx_kl": "approximate KL between the updated and the old policy",
    "beta_comp_mean": "mean DynaMO β_comp over valid tokens",
    "beta_stab_mean": "mean DynaMO β_stab over valid tokens",
    "reward_mean": "mean reward of the trained responses",
    "accuracy_mean": "fraction of trained responses the verifier marked correct",
    "response_len_mean": "mean response length in tokens",
    "tokens_per_second": "trained tokens per second of step time",
    "mismatch_abs_mean": "mean |learner old log-prob - sampling log-prob| over tokens",
    "mismatch_kl_token_mean": "KL(engine || learner) per token (k3 of the sampled tokens), "
    "averaged over tokens",
    "mismatch_kl_seq_mean": "KL(engine || learner) per token (k3), averaged within each "
    "sequence, then over sequences",
    "is_weight_mean": "mean importance weight (learner.algorithm.is_mode; 1 when off)",
    "is_weight_p1": "1st percentile of the tokens' importance weights",
    "is_weight_p10": "10th percentile of the tokens' importance weights",
    "is_weight_p50": "median of the tokens' importance weights",
    "is_weight_p90": "90th percentile of the tokens' importance weights",
    "is_weight_p99": "99th percentile of the tokens' importance weights",
    "is_masked_share": "share of tokens a masked IS mode dropped",
    "staleness_mean": "mean weight versions between sampling (a response's oldest token) and "
    "training",
    "staleness_max": "most weight versions between a trained token's sampling and training",
    "version_spread_mean": "mean newest minus oldest weight version within a response",
    "version_spread_max": "largest newest minus oldest weight version within a response",
    "value_loss": "critic value loss (PPO with GAE)",
    "opd_reverse_kl": "on-policy distillation: mean per-token log π_student − log π_teacher "
    "over trained tokens (rollout.teacher)",
    "push_seconds": "seconds of the last weight push",
    "push_gb_per_s": "throughput of the last weight push in GB/s",
    "push_bytes": "bytes the last weight push moved (a LoRA policy: its adapters alone)",
    "weight_version": "weight version after the last push",
    "step": "last completed train step",
    "episode_turns_mean": "multi-turn samples: mean model turns (rollout.env)",
    "tool_call_rate": "multi-turn samples: fraction that called a tool",
    "tool_calls_mean": "multi-turn samples: mean tool calls",
    "tool_error_rate": "multi-turn samples: fraction of tool calls that failed",
    "equal_reward_streak": "train steps in a row whose rewards were all equal (no signal)",
    "grad_alloc_corr": "correlation of the prompts' allocations with their gradient spreads",
    "grad_var_ratio": "estimated gradient variance of the step's allocation / uniform n's",
    "grad_spread_mean": "mean gradient spread of the step's prompts (allocator.method grad)",
    "grad_zero_adv_share": "share of the step's prompts whose group had zero advantage",
    "gen_groups_kept": "groups the last step trained on",
    "gen_groups_dropped": "groups generated for the last step and not trained on (dropped by "
    "the workers, rollout.drop_uniform_groups, or skipped by the learner's filters)",
    "gen_rollouts_kept": "rollouts (episodes) of the groups the last step trained on",
    "gen_rollouts_dropped": "rollouts (episodes) of the last step's dropped groups",
    "gen_tokens_kept": "generated tokens of the groups the last step trained on",
    "gen_tokens_dropped": "generated tokens of the last step's dropped groups",
    "alloc_above": "prompts of the last step's consumed groups allocated above uniform n "
    "(allocator.n_per_prompt)",
    "alloc_at": "prompts of the last step's consumed groups allocated exactly uniform n",
    "alloc_below": "prompts of the last step's consumed groups allocated below uniform n",
    "alloc_skipped": "prompts the allocator skipped (0 responses), carried on the entries the "
    "last step consumed",
}
LAG_PREFIX = "mismatch_kl_lag"
"""Step-record keys ``mismatch_kl_lag<k>`` feed ``dynamo_learner_mismatch_kl_by_lag{lag="<k>"}``."""
PHASES = ("read", "forward", "backward", "optimizer", "checkpoint", "push")
_STEP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class LearnerMetrics(MetricSet):
    """Prometheus metrics of the learner; ``record_step`` feeds them from a step record."""

    service = "learner"
    steps = counter("steps_total", "train steps completed")
    groups = counter("groups_total", "prompt groups trained on")
    tokens = counter("tokens_total", "response tokens trained on")
    skipped = counter("groups_skipped_total", "groups read but not trained on", "reason")
    dead_letters = counter("dead_letters_total", "stream entries sent to the dead-letter stream")
    gen_groups = counter(
        "generated_groups_total",
        "groups generated for the steps, by fate: kept (trained on) or dropped (by the workers "
        "before the stream, or by the learner's filters)",
        "fate",
    )
    gen_rollouts = counter(
        "generated_rollouts_total", "rollouts (episodes) of those groups, by fate", "fate"
    )
    gen_tokens = counter(
        "generated_tokens_total", "generated (model) tokens of those groups, by fate", "fate"
    )
    equal_reward_warnings = counter(
        "equal_reward_warnings_total",
        "warnings: learner.equal_reward_warn_steps steps in a row with all rewards equal",
    )
    mismatch_by_lag = gauge(
        "mismatch_kl_by_lag",
        "KL(engine || learner) per token (k3) over the samples this many weight versions "
        "behind (last step that had them)",
        "lag",
    )
    pushes = counter("pushes_total", "weight pushes", "transport", "outcome")
    phase_seconds = histogram(
        "phase_seconds", "seconds per step phase", "phase", buckets=_STEP_BUCKETS
    )
    step_seconds = histogram("step_seconds", "seconds per train step", buckets=_STEP_BUCKETS)

    def __init__(self, metrics: ServiceMetrics | None = None) -> None:
        # The step record's gauges first, as before the declared metrics (the /metrics order).
        m = metrics if metrics is not None else ServiceMetrics(self.service)
        self.gauges = {key: m.gauge(key, doc) for key, doc in GAUGES.items()}
        super().__init__(metrics=m)

    def record_step(self, record: dict[str, Any]) -> None:
        for key, step_gauge in self.gauges.items():
            value = record.get(key)
            if isinstance(value, int | float):
                step_gauge.set(float(value))
        for key, value in record.items():
            if key.startswith(LAG_PREFIX) and isinstance(value, int | float):
                self.mismatch_by_lag.labels(key.removeprefix(LAG_PREFIX)).set(float(value))
        self.steps.inc()
        if record.get("equal_reward_warning"):
            self.equal_reward_warnings.inc()
        self.groups.inc(float(record.get("groups", 0)))
        for fate in ("kept", "dropped"):
            for name, series in (
                ("groups", self.gen_groups),
                ("rollouts", self.gen_rollouts),
                ("tokens", self.gen_tokens),
            ):
                value = record.get(f"gen_{name}_{fate}")
                if isinstance(value, int | float):
                    series.labels(fate).inc(float(value))
        self.tokens.inc(float(record.get("tokens", 0)))
        for phase in PHASES:
            seconds = record.get(f"time_{phase}")
            if isinstance(seconds, int | float):
                self.phase_seconds.labels(phase).observe(float(seconds))
        if isinstance(record.get("time_step"), int | float):
            self.step_seconds.observe(float(record["time_step"]))
