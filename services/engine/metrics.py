"""Prometheus metrics of the embedded inference engine, via ``ServiceMetrics``.

This module imports no torch: dashboards and tests instantiate this class to check names.
"""

from __future__ import annotations

from dynamo_rl.metrics import ServiceMetrics


class EngineMetrics:
    """The embedded inference engine's metrics (``dynamo_engine_*``)."""

    def __init__(self) -> None:
        m = ServiceMetrics("engine")
        self.metrics = m
        self.requests = m.counter(
            "requests_total", "HTTP generation requests by route and status", ["route", "status"]
        )
        self.request_seconds = m.histogram(
            "request_seconds", "Time from request to response (generation routes)", ["route"]
        )
        self.prompt_tokens = m.counter("prompt_tokens_total", "Prompt tokens prefilled")
        self.generated_tokens = m.counter("generated_tokens_total", "Tokens generated")
        self.sequences = m.counter("sequences_total", "Sequences generated (prompts x n)")
        self.batch_size = m.histogram(
            "batch_sequences",
            "Sequences decoded together per batch (continuous batching: after each join)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        )
        self.batch_seconds = m.histogram("batch_seconds", "Wall time of one batch (prefill+decode)")
        self.tokens_per_second = m.gauge(
            "tokens_per_second", "Generated tokens per second of the last batch"
        )
        self.queued_sequences = m.gauge(
            "queued_sequences", "Sequences waiting for a batch (sampled at scrape)"
        )
        self.queued_tasks = m.gauge(
            "queued_tasks",
            "Weight updates, pauses and adapter loads waiting for the scheduler (sampled at "
            "scrape)",
        )
        self.requests_in_flight = m.gauge(
            "requests_in_flight", "Generation requests received and not yet answered"
        )
        self.weight_version = m.gauge("weight_version", "Weight version currently served")
        self.weight_updates = m.counter(
            "weight_updates_total",
            "Weight updates by source (distributed, disk) and outcome (ok, error)",
            ["source", "outcome"],
        )
        self.weight_update_seconds = m.histogram(
            "weight_update_seconds", "Time to receive and load one weight update", ["source"]
        )
