"""Every service's metrics follow the one naming scheme the dashboards rely on:
``dynamo_<service>_<name>``, ``_total`` only on counters, base units (seconds, bytes), each
service's metrics in one class built on :class:`dynamo_rl.metrics.ServiceMetrics`."""

from __future__ import annotations

import re

import pytest

from tests.deploy.registry import METRIC_CLASSES, service_registry

# Unit words that are not base units (seconds, bytes, ratios as fractions).
NON_BASE_UNITS = re.compile(
    r"_(ms|us|ns|millis|milliseconds|microseconds|minutes|hours|kb|mb|gb|kib|mib|gib|percent)(_|$)"
)
# Known exceptions, each waiting for its owner to rename it (kept visible here, not hidden).
NON_BASE_UNIT_EXCEPTIONS = {
    "dynamo_learner_push_gb_per_s",  # -> push_bytes_per_second
}


@pytest.mark.parametrize("service", sorted(METRIC_CLASSES))
def test_names_follow_the_scheme(service: str) -> None:
    reg = service_registry(service)
    assert reg.instances
    for instance in reg.instances:
        metrics = instance.metrics  # type: ignore[attr-defined]
        assert metrics.service == service, (
            f"{type(instance).__name__} registers as {metrics.service}"
        )
        for family in metrics.registry.collect():
            name = family.name
            assert re.fullmatch(rf"dynamo_{service}_[a-z][a-z0-9_]*", name), name
            # Counters are exposed with _total by the client; nothing else may look like one.
            if family.type != "counter":
                assert not name.endswith("_total"), f"{name}: only counters end in _total"
            if name not in NON_BASE_UNIT_EXCEPTIONS:
                assert not NON_BASE_UNITS.search(name), f"{name}: use base units (seconds, bytes)"
            assert family.documentation.strip(), f"{name} has no help text"


def test_the_exceptions_still_exist() -> None:
    """An exception whose metric was renamed must leave the list (so the list stays honest)."""
    reg = service_registry("learner")
    stale = {n for n in NON_BASE_UNIT_EXCEPTIONS if n not in reg.names}
    assert not stale, f"renamed or removed, drop from NON_BASE_UNIT_EXCEPTIONS: {stale}"
