"""The reward service's Prometheus metrics, all in one place (``dynamo_reward_*``)."""

from __future__ import annotations

from dynamo_rl.metrics import MetricSet, counter, gauge, histogram


class RewardMetrics(MetricSet):
    """Every metric of the reward service; ``metrics`` holds the registry and exposition."""

    service = "reward"
    requests = counter(
        "requests_total", "HTTP requests answered, by route and status code", "route", "code"
    )
    request_seconds = histogram(
        "request_duration_seconds", "Time to answer a request, by route", "route"
    )
    items = counter("items_total", "Items scored, by kind and result reason", "kind", "reason")
    item_seconds = histogram(
        "item_duration_seconds", "Time to score one item once admitted, by kind", "kind"
    )
    queue_depth = gauge(
        "queue_depth", "Items admitted and not yet scored (running + waiting), by kind", "kind"
    )
    rejections = counter(
        "rejections_total",
        "Requests refused before scoring: queue_full (429), body_too_large (413), invalid (422)",
        "reason",
    )
    sandbox_starts = counter(
        "sandbox_starts_total", "Sandboxes started (compile and run steps), by outcome", "status"
    )
    sandbox_seconds = histogram(
        "sandbox_run_duration_seconds", "Wall-clock time of one sandboxed run"
    )
    math_worker_restarts = counter(
        "math_worker_restarts_total", "Math workers killed and replaced (timeout or crash)"
    )
    math_path = counter(
        "math_items_by_path_total",
        "Math items by how their verdict was reached: fast (no math-verify), dedup (shared "
        "an identical item's), worker (math-verify in a worker)",
        "path",
    )
    model_batch_size = histogram(
        "model_batch_size",
        "Pairs per reward-model forward pass, by model",
        "model",
        buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    )
    model_worker_restarts = counter(
        "model_worker_restarts_total", "Reward-model workers restarted, by model", "model"
    )
    judge_requests = counter(
        "judge_requests_total",
        "Requests to LLM judges, by judge and outcome (ok, timeout, connect_error)",
        "judge",
        "outcome",
    )
    components = counter(
        "components_total",
        "Composite components, by spec (data source), component and outcome "
        "(scored, failed, gated)",
        "data_source",
        "component",
        "outcome",
    )
    component_score = histogram(
        "component_score",
        "Unweighted component scores (and 'total', the weighted sum), by spec and component",
        "data_source",
        "component",
        buckets=(-1.0, -0.5, -0.1, 0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
    )
