"""``MetricSet``: a service's metrics declared once as class attributes, made per instance in the
instance's own registry, exposed in the order declared, under the one naming scheme."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dynamo_rl.metrics import MetricSet, ServiceMetrics, counter, gauge, histogram


class Demo(MetricSet):
    service = "demo"
    calls = counter("calls_total", "calls by route", "route")
    depth = gauge("depth", "queue depth")
    seconds = histogram("seconds", "time per call", "route", buckets=(0.1, 1.0))


class MoreDemo(Demo):
    errors = counter("errors_total", "errors")


def test_each_instance_makes_the_declared_metrics_in_its_own_registry() -> None:
    a, b = Demo(), Demo()
    assert isinstance(a.calls, Counter) and isinstance(a.depth, Gauge)
    assert isinstance(a.seconds, Histogram)
    a.calls.labels("x").inc(3)
    get = a.metrics.registry.get_sample_value
    assert get("dynamo_demo_calls_total", {"route": "x"}) == 3.0
    assert b.metrics.registry.get_sample_value("dynamo_demo_calls_total", {"route": "x"}) is None
    a.seconds.labels("x").observe(0.5)
    assert get("dynamo_demo_seconds_bucket", {"route": "x", "le": "1.0"}) == 1.0
    assert get("dynamo_demo_seconds_bucket", {"route": "x", "le": "0.1"}) == 0.0


def test_metrics_are_exposed_in_declaration_order_subclass_after_base() -> None:
    text = MoreDemo().metrics.exposition().decode()
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    order = [name for name in helps if not name.endswith("_created")]
    assert order == ["dynamo_demo_calls_total", "dynamo_demo_depth", "dynamo_demo_seconds",
                     "dynamo_demo_errors_total"]  # fmt: skip


def test_a_given_registry_or_service_metrics_is_used() -> None:
    registry = CollectorRegistry()
    demo = Demo(registry)
    assert demo.metrics.registry is registry
    shared = ServiceMetrics("demo")
    assert Demo(metrics=shared).metrics is shared


def test_the_naming_scheme_is_enforced_when_made() -> None:
    class Bad(MetricSet):
        service = "demo"
        calls = counter("calls", "a counter without _total")

    with pytest.raises(ValueError, match="must end in _total"):
        Bad()


def test_every_services_metrics_is_a_metric_set() -> None:
    """The allocator's, reward service's, rollout worker's and learner's metrics are declared on
    MetricSet (the engine's keep ServiceMetrics calls until services/engine/ is reorganised)."""
    from allocator.metrics import AllocatorMetrics
    from learner.metrics import LearnerMetrics
    from services.reward.metrics import RewardMetrics
    from services.rollout.metrics import WorkerMetrics

    for cls, service in ((AllocatorMetrics, "allocator"), (RewardMetrics, "reward"),
                         (WorkerMetrics, "rollout"), (LearnerMetrics, "learner")):  # fmt: skip
        assert issubclass(cls, MetricSet) and cls().metrics.service == service
