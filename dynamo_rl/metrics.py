"""One way to make Prometheus metrics: ``dynamo_<service>_<name>`` in base units.

Each service builds a :class:`ServiceMetrics` once and registers its metrics through it, so names
follow one scheme (counters end in ``_total``, durations in ``_seconds``, sizes in ``_bytes``) and
every service has its own registry (no global state shared between tests in one process).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

__all__ = ["CONTENT_TYPE_LATEST", "LATENCY_BUCKETS", "ServiceMetrics"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)


class ServiceMetrics:
    """Metrics of one service, named ``dynamo_<service>_<name>``."""

    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        if not _NAME.match(service):
            raise ValueError(f"service name must match {_NAME.pattern}, got {service!r}")
        self.service = service
        self.registry = registry if registry is not None else CollectorRegistry()

    def name(self, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"metric name must match {_NAME.pattern}, got {name!r}")
        return f"dynamo_{self.service}_{name}"

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        """A counter; ``name`` must end in ``_total`` (the exposed name keeps it)."""
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end in _total")
        return Counter(self.name(name.removesuffix("_total")), doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(self.name(name), doc, labels, registry=self.registry)

    def histogram(
        self,
        name: str,
        doc: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        return Histogram(self.name(name), doc, labels, buckets=buckets, registry=self.registry)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format (for a ``/metrics`` route)."""
        return generate_latest(self.registry)

    def names(self) -> set[str]:
        """Every sample name this registry exposes, now or once its labelled metrics are used
        (a labelled metric has no sample until a label set is first used); dashboards are
        checked against it."""
        names = {s.name for m in self.registry.collect() for s in m.samples}
        for family in self.registry.collect():
            names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        return names

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on its own port (for non-HTTP services); returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for every ``v`` at once: the same buckets, sum and count, one
    increment per bucket touched instead of a Python call per value (an ``observe`` costs a few
    µs; a service that observes hundreds of values per request feels it). ``histogram`` is an
    unlabelled histogram or one label set's child."""
    if len(values) == 0:
        return
    import numpy as np

    histogram._raise_if_not_observable()  # type: ignore[attr-defined]
    amounts = np.asarray(values, dtype=np.float64)
    bounds = np.asarray(histogram._upper_bounds, dtype=np.float64)  # type: ignore[attr-defined]
    # observe() puts v in the first bucket whose bound is >= v: searchsorted's left side.
    per_bucket = np.bincount(np.searchsorted(bounds, amounts, side="left"), minlength=len(bounds))
    histogram._sum.inc(float(amounts.sum()))  # type: ignore[attr-defined]
    for i in np.flatnonzero(per_bucket[: len(bounds)]).tolist():
        histogram._buckets[i].inc(int(per_bucket[i]))  # type: ignore[attr-defined]
