"""Every Prometheus metric of the allocator, in one class (``dynamo_allocator_...``).

The per-prompt distributions (counts, priorities) observe at most ``DISTRIBUTION_SAMPLE`` prompts of
each request, evenly strided: one ``observe`` costs about 2 µs, and a 64k-prompt request must not
spend 100 ms on bookkeeping. Totals (prompts, responses) are exact.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dynamo_rl.metrics import MetricSet, counter, gauge, histogram, observe_many

__all__ = ["DISTRIBUTION_SAMPLE", "AllocatorMetrics"]

DISTRIBUTION_SAMPLE = 16
METHODS = ("Allocate", "ReportOutcomes", "GetStats", "ResetNamespace", "ExportNamespace")
COUNT_BUCKETS = (1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 48, 64, 128)
PRIORITY_BUCKETS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6)
BUDGET_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)


class AllocatorMetrics(MetricSet):
    """The allocator's metrics; ``metrics`` holds its own registry (no global state)."""

    service = "allocator"
    requests = counter(
        "requests_total", "gRPC requests by method and status code", "method", "code"
    )
    latency = histogram("request_latency_seconds", "gRPC handler latency by method", "method")
    prompts_allocated = counter(
        "prompts_allocated_total", "prompts that received a count from Allocate"
    )
    responses_allocated = counter(
        "responses_allocated_total", "responses handed out by Allocate (sum of budgets)"
    )
    unexplored_prompts = counter(
        "unexplored_prompts_total", "prompts allocated while still explored (no priority)"
    )
    skipped_prompts = counter(
        "skipped_prompts_total",
        "prompts allocated no response (the skip rule; hopeless prompts when hopeless_n is 0)",
    )
    budget = histogram(
        "budget_responses", "budget (responses) of each Allocate request", buckets=BUDGET_BUCKETS
    )
    counts = histogram(
        "count_responses", "responses per prompt (sampled per request)", buckets=COUNT_BUCKETS
    )
    priorities = histogram(
        "priority", "priority per explored prompt (sampled per request)", buckets=PRIORITY_BUCKETS
    )
    priority_exploring = counter(
        "priority_exploring_total",
        "prompts of the priority histogram's sample still explored (no priority yet): the "
        "same sample as dynamo_allocator_priority, so the two draw one distribution",
    )
    outcomes = counter("outcomes_reported_total", "prompt outcomes reported")
    samples_reported = counter(
        "samples_reported_total", "responses (attempts) reported in outcomes"
    )
    redis_errors = counter("redis_errors_total", "requests failed because of Redis")
    redis_up = gauge("redis_up", "1 when the last Redis call or ping succeeded")

    def __init__(self) -> None:
        super().__init__()
        # Labelled series exist from the start (zeros), so dashboards and alerts see every one.
        for method in METHODS:
            self.latency.labels(method)
            for code in ("OK", "INVALID_ARGUMENT", "UNAVAILABLE"):
                self.requests.labels(method, code)

    def observe_allocation(
        self, budget: int, counts: npt.NDArray[np.int64], priorities: npt.NDArray[np.float64]
    ) -> None:
        n = len(counts)
        self.prompts_allocated.inc(n)
        self.responses_allocated.inc(budget)
        self.budget.observe(budget)
        if n == 0:
            return
        self.skipped_prompts.inc(int(np.count_nonzero(counts == 0)))
        stride = max(1, -(-n // DISTRIBUTION_SAMPLE))
        observe_many(self.counts, counts[::stride])
        sampled = priorities[::stride]
        observe_many(self.priorities, sampled[sampled >= 0])
        self.priority_exploring.inc(int(np.count_nonzero(sampled < 0)))
        self.unexplored_prompts.inc(int(np.count_nonzero(priorities < 0)))
