"""Prometheus metrics of the rollout worker, via ``ServiceMetrics``.

This module imports no torch: dashboards and tests instantiate these classes to check names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dynamo_rl.codec import TrajectoryGroup
from dynamo_rl.metrics import MetricSet, counter, gauge, histogram

if TYPE_CHECKING:
    from services.rollout.episodes import Episode

TOOL_ERROR_KINDS = ("malformed", "timeout", "failed", "unknown", "bad", "other")
"""Labels of ``dynamo_rollout_tool_errors_total``: a malformed call, a step past
``rollout.env.tool_timeout_s``, a tool that failed (non-zero exit, exception), an unknown tool,
bad arguments, anything else."""


class WorkerMetrics(MetricSet):
    """The rollout worker's metrics (``dynamo_rollout_*``)."""

    service = "rollout"
    batches = counter("batches_total", "Rollout batches pushed to the stream")
    groups = counter("groups_total", "Trajectory groups pushed (one per prompt)")
    responses = counter("responses_total", "Responses pushed")
    tokens = counter("tokens_generated_total", "Response tokens generated")
    tokens_per_second = gauge(
        "tokens_per_second", "Generated tokens per second of generation in the last batch"
    )
    reward_mean = gauge("reward_mean", "Mean reward of the last batch's responses")
    correct_fraction = gauge(
        "correct_fraction", "Fraction of the last batch's responses judged correct"
    )
    allocation = histogram(
        "allocation_count",
        "Responses allocated per prompt",
        buckets=(0, 1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128),
    )
    zero_advantage_responses = counter(
        "zero_advantage_responses_total",
        "Responses pushed in groups whose rewards were all equal (no signal under "
        "group-normalised advantages); over responses_total: the zero-advantage share",
    )
    dropped_groups = counter(
        "dropped_groups_total",
        "Groups dropped before the stream because their episodes all scored the same "
        "(rollout.drop_uniform_groups; their outcomes still reported to the allocator)",
    )
    dropped_rollouts = counter(
        "dropped_rollouts_total", "Rollouts (episodes) of the groups dropped before the stream"
    )
    dropped_tokens = counter(
        "dropped_tokens_total", "Generated (model) tokens of the groups dropped before the stream"
    )
    leases_reissued = counter(
        "leases_reissued_total",
        "Prompts taken over from lapsed leases (a worker died mid-batch) and re-issued",
    )
    allocator_fallbacks = counter(
        "allocator_fallbacks_total", "Batches that used uniform n because the allocator failed"
    )
    report_failures = counter(
        "report_failures_total", "ReportOutcomes calls that failed (outcomes kept for the next)"
    )
    staleness = gauge(
        "staleness_versions", "Learner's latest weight version minus the engines' (oldest)"
    )
    weight_version = gauge("weight_version", "Oldest weight version among the engines")
    waits = counter(
        "waits_total",
        "Times the worker waited, by reason (staleness, backpressure, engine, reward, redis)",
        "reason",
    )
    wait_seconds = counter("wait_seconds_total", "Seconds spent waiting, by reason", "reason")
    pending_groups = gauge(
        "pending_groups", "Groups in the stream the learner has not read yet (its lag)"
    )
    engine_failures = counter(
        "engine_failures_total", "Failed engine requests (retried elsewhere)", "url"
    )
    reward_retries = counter(
        "reward_retries_total", "Retried /v1/verify requests (reward service down or busy)"
    )
    prompts_over_length = counter(
        "prompts_over_length_total",
        "Dataset prompts longer than rollout.max_prompt_len at load, by what was done "
        "(dropped, truncated, refused)",
        "action",
    )
    prompts_refused = counter(
        "prompts_refused_total",
        "Prompts an engine refused (HTTP 4xx), dead-lettered and served no more",
    )
    batch_seconds = histogram(
        "batch_seconds",
        "Wall time of one batch, by phase (allocate, generate, verify, push, total)",
        "phase",
        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    )
    # Multi-turn episodes (rollout.env; docs/agents.md).
    episodes = counter(
        "episodes_total",
        "Episodes pushed, by why they ended (done, max_turns, max_tool_calls, token_budget)",
        "end",
    )
    episodes_dropped = counter(
        "episodes_dropped_total", "Episodes dropped because the sandbox stayed down"
    )
    verifiers_dropped = counter(
        "verifiers_episodes_dropped_total",
        "verifiers episodes dropped (rollout.env.name verifiers), by reason (env_error, "
        "rubric_error, no_token_ids)",
        "reason",
    )
    episode_turns = histogram(
        "episode_turns", "Model turns per episode", buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32)
    )
    episode_forks = counter(
        "episode_forks_total",
        "Samples forked because the chat template's next prompt did not extend the tokens",
    )
    tool_calls = counter("tool_calls_total", "Tool calls made by episodes")
    tool_errors = counter(
        "tool_errors_total",
        "Tool calls that did not run cleanly, by kind (malformed, timeout, failed, unknown, "
        "bad, other)",
        "kind",
    )
    tool_latency = histogram("tool_latency_seconds", "Latency of one tool call")
    masked_token_share = gauge(
        "masked_token_share",
        "Share of the last batch's episode tokens that are observations (loss mask 0)",
    )
    episodes_per_second = gauge(
        "episodes_per_second", "Episodes finished per second of generation in the last batch"
    )
    tool_calls_per_second = gauge(
        "tool_calls_per_second",
        "Tool calls made per second of generation in the last batch (episodes' wall time)",
    )

    def waited(self, reason: str, seconds: float) -> None:
        """A wait (or a retry's delay) of ``seconds`` for ``reason``."""
        self.waits.labels(reason).inc()
        self.wait_seconds.labels(reason).inc(seconds)

    def record_episodes(self, episodes: Sequence[Episode], generate_s: float) -> None:
        """The episode series, recorded for multi-turn episodes only (a single-turn run keeps the
        series it always had)."""
        if not episodes:
            return
        m = self
        model = obs = calls = 0
        for e in episodes:
            m.episodes.labels(e.end_reason).inc()
            m.episode_turns.observe(len(e.turns))
            m.episode_forks.inc(e.forks)
            model += e.model_tokens
            obs += e.observation_tokens
            for c in e.tool_calls:
                calls += 1
                m.tool_calls.inc()
                m.tool_latency.observe(c.latency_s)
                if c.error:
                    kind = "malformed" if c.malformed else c.error.split(":")[0].split(" ")[0]
                    m.tool_errors.labels(kind if kind in TOOL_ERROR_KINDS else "other").inc()
        if model + obs:
            m.masked_token_share.set(obs / (model + obs))
        if generate_s > 0:
            m.episodes_per_second.set(len(episodes) / generate_s)
            m.tool_calls_per_second.set(calls / generate_s)

    def record_batch(self, groups: Sequence[TrajectoryGroup], responses: int,
                       rewards: list[float], corrects: int, n_tokens: int,
                       phases: dict[str, float]) -> None:  # fmt: skip
        """The per-batch series (``responses`` pushed; ``rewards`` and ``corrects`` per episode;
        ``phases`` the batch's seconds by phase)."""
        m = self
        m.batches.inc()
        m.groups.inc(len(groups))
        m.responses.inc(responses)
        m.zero_advantage_responses.inc(zero_advantage_responses(groups))
        m.tokens.inc(n_tokens)
        if phases["generate"] > 0:
            m.tokens_per_second.set(n_tokens / phases["generate"])
        if rewards:
            m.reward_mean.set(sum(rewards) / len(rewards))
            m.correct_fraction.set(corrects / len(rewards))
        for phase, seconds in phases.items():
            m.batch_seconds.labels(phase).observe(seconds)


def zero_advantage_responses(groups: Sequence[TrajectoryGroup]) -> int:
    """Responses in groups whose rewards are all equal: group-normalised advantages are 0 there,
    so they carry no learning signal (``dynamo_rollout_zero_advantage_responses_total``)."""
    total = 0
    for g in groups:
        rewards = [r.reward for r in g.responses]
        if rewards and max(rewards) == min(rewards):
            total += len(rewards)
    return total
