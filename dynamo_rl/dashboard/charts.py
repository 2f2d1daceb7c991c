"""What the built-in dashboard draws: each chart, and the metric behind each of its lines.

A series names a Prometheus sample (``metric``) exactly as a service exposes it, and how to turn the
scraped samples into a line (``how``):

- ``value``: the samples' current value, summed over the label sets that match ``labels``;
- ``rate``: per-second increase of a counter between two scrapes;
- ``ratio``: per-second increase of ``metric`` over that of ``per`` (a histogram's ``_sum`` over
  its ``_count`` gives the mean of what it observes in that interval);
- ``buckets``: a histogram's ``_bucket`` samples as a distribution (bar chart of the latest scrape).

A series may also name a field of the learner's JSONL metrics log (``field``): when the log has it,
the line is the log's per-step history (x = step) and the scrape is not used for that series.

``split`` = ``"target"`` draws one line per scraped endpoint (tokens/s per engine) instead of the
sum. Every ``metric``/``per`` here is checked against the services' metric registries by a test,
so a typo or a renamed metric fails CI rather than leaving an empty chart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

How = Literal["value", "rate", "ratio", "buckets"]


@dataclass(frozen=True)
class Series:
    label: str
    metric: str
    how: How = "value"
    per: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    field: str | None = None
    split: Literal["none", "target"] = "none"


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    group: str
    unit: str
    series: tuple[Series, ...]
    kind: Literal["line", "bars"] = "line"

    def to_json(self) -> dict[str, object]:
        return asdict(self)


CHARTS: tuple[Chart, ...] = (
    # --- training ---------------------------------------------------------------------------
    Chart(
        "reward",
        "Reward and accuracy",
        "training",
        "",
        (
            Series("reward mean", "dynamo_learner_reward_mean", field="reward_mean"),
            Series("accuracy", "dynamo_learner_accuracy", field="accuracy"),
        ),
    ),
    Chart(
        "loss",
        "Policy loss",
        "training",
        "",
        (Series("loss", "dynamo_learner_loss", field="loss"),),
    ),
    Chart(
        "kl", "KL to reference", "training", "", (Series("kl", "dynamo_learner_kl", field="kl"),)
    ),
    Chart(
        "entropy",
        "Token entropy",
        "training",
        "nats",
        (Series("entropy", "dynamo_learner_entropy", field="entropy"),),
    ),
    Chart(
        "beta",
        "DynaMO modulation (β means)",
        "training",
        "",
        (
            Series("β_stab", "dynamo_learner_beta_stab_mean", field="beta_stab_mean"),
            Series("β_comp", "dynamo_learner_beta_comp_mean", field="beta_comp_mean"),
        ),
    ),
    # --- allocation -------------------------------------------------------------------------
    Chart(
        "alloc_counts",
        "Rollouts per prompt (allocated count)",
        "allocation",
        "prompts",
        (Series("prompts", "dynamo_allocator_allocated_count_bucket", how="buckets"),),
        kind="bars",
    ),
    Chart(
        "alloc_priority",
        "Priority distribution",
        "allocation",
        "prompts",
        (Series("prompts", "dynamo_allocator_priority_bucket", how="buckets"),),
        kind="bars",
    ),
    Chart(
        "alloc_half",
        "Share of budget to half-solved prompts",
        "allocation",
        "",
        (Series("share", "dynamo_allocator_half_solved_budget_share"),),
    ),
    # --- throughput -------------------------------------------------------------------------
    Chart(
        "tokens",
        "Generated tokens/s per engine",
        "throughput",
        "tokens/s",
        (Series("engine", "dynamo_engine_generated_tokens_total", how="rate", split="target"),),
    ),
    Chart(
        "groups",
        "Trajectory groups/s",
        "throughput",
        "groups/s",
        (Series("groups", "dynamo_rollout_groups_total", how="rate"),),
    ),
    Chart(
        "step_split",
        "Learner step time split",
        "throughput",
        "s",
        (
            Series(
                "forward/backward",
                "dynamo_learner_phase_seconds_sum",
                how="ratio",
                per="dynamo_learner_phase_seconds_count",
                labels={"phase": "train"},
            ),
            Series(
                "data wait",
                "dynamo_learner_phase_seconds_sum",
                how="ratio",
                per="dynamo_learner_phase_seconds_count",
                labels={"phase": "data"},
            ),
        ),
    ),
    Chart(
        "push",
        "Weight push time",
        "throughput",
        "s",
        (
            Series(
                "push",
                "dynamo_learner_weight_push_seconds_sum",
                how="ratio",
                per="dynamo_learner_weight_push_seconds_count",
            ),
        ),
    ),
    # --- health -----------------------------------------------------------------------------
    Chart(
        "queue",
        "Stream queue depth",
        "health",
        "groups",
        (Series("pending", "dynamo_rollout_stream_length"),),
    ),
    Chart(
        "staleness",
        "Staleness (weight versions behind)",
        "health",
        "versions",
        (Series("staleness", "dynamo_learner_staleness", field="staleness"),),
    ),
    Chart(
        "errors",
        "Errors and back-pressure",
        "health",
        "1/s",
        (
            Series("reward errors", "dynamo_reward_errors_total", how="rate"),
            Series("reward 429s", "dynamo_reward_rejected_total", how="rate"),
        ),
    ),
)


def metric_names(charts: tuple[Chart, ...] = CHARTS) -> set[str]:
    """Every Prometheus sample name the charts read (checked against the registries)."""
    names: set[str] = set()
    for chart in charts:
        for s in chart.series:
            names.add(s.metric)
            if s.per:
                names.add(s.per)
    return names


def jsonl_fields(charts: tuple[Chart, ...] = CHARTS) -> set[str]:
    """Every JSONL metrics-log field the charts read."""
    return {s.field for c in charts for s in c.series if s.field}
