"""What the built-in dashboard draws: each chart, and the metric behind each of its lines.

A series names a Prometheus sample (``metric``) exactly as a service exposes it, and how to turn the
scraped samples into a line (``how``):

- ``value``: the samples' current value, summed over the label sets that match ``labels``;
- ``rate``: per-second increase of a counter between two scrapes;
- ``ratio``: per-second increase of ``metric`` over that of ``per`` (a histogram's ``_sum`` over
  its ``_count`` gives the mean of what it observes in that interval);
- ``buckets``: a histogram's ``_bucket`` samples as a distribution (bar chart of the latest scrape).

In a bar chart, a ``value`` series is one bar of its own (labelled with the series' label, left of
the histogram's, drawn when above 0): the "exploring" bar of the priority chart.

A series may also name a field of the learner's JSONL metrics log (``field``): when the log has it,
the line is the log's per-step history (x = step) and the scrape is not used for that series.

A chart's series either all name a log field or none does, so its lines share one x axis.
``split`` = ``"target"`` draws one line per scraped endpoint (tokens/s per engine) instead of the
sum. Every ``metric``/``per`` here is checked against the services' metric registries by a test,
so a typo or a renamed metric fails CI rather than leaving an empty chart; vLLM's own series
(``vllm:*``, a vLLM engine's history) must be in :data:`dynamo_rl.metrics.VLLM_SERIES`, which the
vLLM tests check against a real server.
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


def _ratio(label: str, histogram: str, **labels: str) -> Series:
    """Mean of what a histogram observed per scrape interval (``_sum`` rate over ``_count``)."""
    return Series(
        label, f"{histogram}_sum", how="ratio", per=f"{histogram}_count", labels=dict(labels)
    )


def _phase(phase: str) -> Series:
    # The JSONL log has each phase's seconds as time_<phase>; the scrape has a labelled histogram.
    s = _ratio(phase, "dynamo_learner_phase_seconds", phase=phase)
    return Series(s.label, s.metric, s.how, s.per, s.labels, field=f"time_{phase}")


def _learner(label: str, key: str) -> Series:
    """A learner step-record key: the JSONL field ``key``, scraped as ``dynamo_learner_<key>``."""
    return Series(label, f"dynamo_learner_{key}", field=key)


def _lag(k: int) -> Series:
    """The mismatch KL of samples ``k`` weight versions behind (a labelled learner gauge)."""
    return Series(
        f"lag {k}", "dynamo_learner_mismatch_kl_by_lag", labels={"lag": str(k)},
        field=f"mismatch_kl_lag{k}",
    )  # fmt: skip


CHARTS: tuple[Chart, ...] = (
    # --- training ---------------------------------------------------------------------------
    Chart(
        "reward",
        "Reward and accuracy",
        "training",
        "",
        (_learner("reward mean", "reward_mean"), _learner("accuracy", "accuracy_mean")),
    ),
    Chart(
        "equal_reward",
        "Steps in a row with all rewards equal (no learning signal; warned every "
        "learner.equal_reward_warn_steps)",
        "training",
        "steps",
        (_learner("equal-reward streak", "equal_reward_streak"),),
    ),
    Chart(
        "loss",
        "Loss",
        "training",
        "",
        (_learner("loss", "loss"), _learner("policy loss", "policy_loss")),
    ),
    Chart(
        "kl",
        "KL",
        "training",
        "nats",
        (
            _learner("KL to reference", "kl"),
            _learner("approx KL to old policy", "approx_kl"),
            # On-policy distillation: KL(student || teacher) per token on the student's samples.
            _learner("reverse KL to teacher", "opd_reverse_kl"),
        ),
    ),
    Chart("entropy", "Token entropy", "training", "nats", (_learner("entropy", "entropy"),)),
    Chart(
        "beta",
        "DynaMO modulation (β means)",
        "training",
        "",
        (_learner("β_stab", "beta_stab_mean"), _learner("β_comp", "beta_comp_mean")),
    ),
    Chart(
        "mismatch_kl",
        "Engine/learner mismatch: KL(engine ‖ learner) per token, k3 (by weight-version lag: "
        "samples that many versions behind)",
        "training",
        "nats",
        (
            _learner("over tokens", "mismatch_kl_token_mean"),
            _learner("over sequences", "mismatch_kl_seq_mean"),
            *(_lag(k) for k in range(3)),
        ),
    ),
    Chart(
        "is_weights",
        "Importance weights (quantiles over tokens) and the share a masked mode dropped",
        "training",
        "",
        (
            *(_learner(f"p{q}", f"is_weight_p{q}") for q in (1, 10, 50, 90, 99)),
            _learner("masked share", "is_masked_share"),
        ),
    ),
    # --- allocation -------------------------------------------------------------------------
    Chart(
        "alloc_counts",
        "Rollouts per prompt (allocator)",
        "allocation",
        "prompts",
        (Series("prompts", "dynamo_allocator_count_responses_bucket", how="buckets"),),
        kind="bars",
    ),
    Chart(
        "alloc_priority",
        "Priority at allocation (allocator; prompts still explored have none yet)",
        "allocation",
        "prompts",
        (
            Series("exploring", "dynamo_allocator_priority_exploring_total"),
            Series("prompts", "dynamo_allocator_priority_bucket", how="buckets"),
        ),
        kind="bars",
    ),
    Chart(
        "alloc_budget",
        "Allocations/s",
        "allocation",
        "1/s",
        (
            Series("responses", "dynamo_allocator_responses_allocated_total", how="rate"),
            Series("unexplored prompts", "dynamo_allocator_unexplored_prompts_total", how="rate"),
        ),
    ),
    Chart(
        "grad_alloc",
        "Allocation against the gradient statistic (learner, per step; allocator.method grad)",
        "allocation",
        "",
        (
            _learner("corr(n, gradient spread)", "grad_alloc_corr"),
            _learner("est. gradient variance / uniform n's", "grad_var_ratio"),
            _learner("zero-advantage share of prompts", "grad_zero_adv_share"),
        ),
    ),
    Chart(
        "skip_rate",
        "Share of prompts skipped (allocator: the skip rule gives them no response)",
        "allocation",
        "",
        (
            Series(
                "skipped share",
                "dynamo_allocator_skipped_prompts_total",
                how="ratio",
                per="dynamo_allocator_prompts_allocated_total",
            ),
        ),
    ),
    Chart(
        "alloc_vs_uniform",
        "Prompts per learner step by allocated count against uniform n (allocator.n_per_prompt; "
        "the step's consumed groups), and prompts skipped (allocator: 0 responses)",
        "allocation",
        "prompts",
        (
            _learner("above uniform", "alloc_above"),
            _learner("at uniform", "alloc_at"),
            _learner("below uniform", "alloc_below"),
            _learner("skipped", "alloc_skipped"),
        ),
    ),
    Chart(
        "zero_advantage_share",
        "Share of responses in zero-advantage groups (rollout: all rewards equal, no signal)",
        "allocation",
        "",
        (
            Series(
                "zero-advantage share",
                "dynamo_rollout_zero_advantage_responses_total",
                how="ratio",
                per="dynamo_rollout_responses_total",
            ),
        ),
    ),
    # --- throughput -------------------------------------------------------------------------
    Chart(
        "tokens",
        "Generated tokens/s per engine",
        "throughput",
        "tokens/s",
        (
            Series("engine", "dynamo_engine_generated_tokens_total", how="rate", split="target"),
            Series("vllm", "vllm:generation_tokens_total", how="rate", split="target"),
        ),
    ),
    Chart(
        "engine_batch",
        "Engine batch: sequences per decode batch (embedded), requests running (vLLM)",
        "throughput",
        "sequences",
        (
            Series(
                "engine",
                "dynamo_engine_batch_sequences_sum",
                how="ratio",
                per="dynamo_engine_batch_sequences_count",
                split="target",
            ),
            Series("vllm", "vllm:num_requests_running", split="target"),
        ),
    ),
    Chart(
        "engine_weights",
        "Weight version per engine",
        "throughput",
        "version",
        (Series("engine", "dynamo_engine_weight_version", split="target"),),
    ),
    Chart(
        "groups",
        "Trajectory groups/s",
        "throughput",
        "groups/s",
        (
            Series("pushed by rollout", "dynamo_rollout_groups_total", how="rate"),
            Series("trained by learner", "dynamo_learner_groups_total", how="rate"),
        ),
    ),
    Chart(
        "generation",
        "Generated tokens per learner step: kept (trained on) and dropped (all rewards equal, "
        "dropped by the workers or the learner; stale)",
        "throughput",
        "tokens",
        (
            _learner("kept", "gen_tokens_kept"),
            _learner("dropped", "gen_tokens_dropped"),
        ),
    ),
    Chart(
        "step_split",
        "Learner step time split",
        "throughput",
        "s",
        tuple(_phase(p) for p in ("read", "forward", "backward", "optimizer")),
    ),
    Chart(
        "push",
        "Weight push time",
        "throughput",
        "s",
        (_learner("push", "push_seconds"),),
    ),
    Chart(
        "push_size",
        "Weight push size (a LoRA policy: its adapters)",
        "throughput",
        "bytes",
        (_learner("push", "push_bytes"),),
    ),
    Chart(
        "policy_version",
        "Policy version pushed (a LoRA policy: the adapter's <name>-v<version>)",
        "throughput",
        "version",
        (_learner("learner", "weight_version"),),
    ),
    # --- health -----------------------------------------------------------------------------
    Chart(
        "queue",
        "Queue depth",
        "health",
        "items",
        (
            Series("stream: unread groups", "dynamo_rollout_pending_groups"),
            Series("reward: items queued", "dynamo_reward_queue_depth"),
        ),
    ),
    Chart(
        "staleness",
        "Staleness of trained tokens, and version spread within responses (learner)",
        "health",
        "versions",
        (
            _learner("mean", "staleness_mean"),
            _learner("oldest token", "staleness_max"),
            _learner("spread in a response (mean)", "version_spread_mean"),
            _learner("spread in a response (max)", "version_spread_max"),
        ),
    ),
    Chart(
        "engine_staleness",
        "Engines behind the learner (rollout)",
        "health",
        "versions",
        (Series("oldest engine", "dynamo_rollout_staleness_versions"),),
    ),
    Chart(
        "errors",
        "Errors and back-pressure",
        "health",
        "1/s",
        (
            Series(
                "reward 429s",
                "dynamo_reward_rejections_total",
                how="rate",
                labels={"reason": "queue_full"},
            ),
            Series("engine failures", "dynamo_rollout_engine_failures_total", how="rate"),
            Series("reward retries", "dynamo_rollout_reward_retries_total", how="rate"),
            Series("allocator fallbacks", "dynamo_rollout_allocator_fallbacks_total", how="rate"),
            Series("lease re-issues", "dynamo_rollout_leases_reissued_total", how="rate"),
            Series("dead letters", "dynamo_learner_dead_letters_total", how="rate"),
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
