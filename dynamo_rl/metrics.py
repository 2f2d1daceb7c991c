"""One way to make Prometheus metrics: ``dynamo_<service>_<name>`` in base units.

Each service builds a :class:`ServiceMetrics` once and registers its metrics through it, so names
follow one scheme (counters end in ``_total``, durations in ``_seconds``, sizes in ``_bytes``) and
every service has its own registry (no global state shared between tests in one process). A
service declares its metrics once, one line each, as the class attributes of a :class:`MetricSet`
(:func:`counter`, :func:`gauge`, :func:`histogram`); the set makes them in its registry.

The same registry is also the service's **run-folder history**: :meth:`ServiceMetrics.record`
appends a snapshot of every sample (the names and labels ``/metrics`` exposes) as one JSON line to
``<run dir>/metrics/<service>-<instance>.jsonl`` every ``run.history.interval_s`` seconds, so a
finished run keeps what the Prometheus scrapes saw (see :class:`History` for the format and the
size bound).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, cast

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.metrics_core import Metric

from dynamo_rl.jsonl import read_records

if TYPE_CHECKING:
    from dynamo_rl.config import RunConfig


__all__ = [
    "CONTENT_TYPE_LATEST",
    "LATENCY_BUCKETS",
    "VLLM_SERIES",
    "History",
    "MetricSet",
    "ScrapedMetrics",
    "ServiceMetrics",
    "counter",
    "exposition_samples",
    "gauge",
    "histogram",
    "read_history",
]

VLLM_SERIES = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
"""vLLM's own ``/metrics`` series the dashboard charts (from a vLLM engine's history, which
:class:`ScrapedMetrics` records): generated tokens (tokens/s), requests running (the batch) and
waiting. ``tests/vllm`` checks them against a real vLLM server."""

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


class Recorded:
    """What a run folder's metrics history is taken from: a ``service`` name and ``snapshot()``
    (a list of samples, or None when there is nothing to write this interval)."""

    service: str

    def snapshot(self) -> list[list[object]] | None:
        raise NotImplementedError

    def record(
        self, run_dir: str | Path, instance: str, interval_s: float, max_mb: float
    ) -> History | None:
        """Start appending snapshots to ``<run_dir>/metrics/<service>-<instance>.jsonl`` every
        ``interval_s`` seconds (and once more at exit); ``interval_s`` 0: nothing is recorded."""
        if interval_s <= 0:
            return None
        path = history_path(run_dir, self.service, instance)
        return History(self, path, interval_s, int(max_mb * 2**20)).start()

    def record_run(self, run: RunConfig, instance: str) -> History | None:
        """:meth:`record` as the experiment's ``run`` section says (``run_dir``, ``history``)."""
        return self.record(run.run_dir, instance, run.history.interval_s, run.history.max_mb)


class ServiceMetrics(Recorded):
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
        """Serve ``/metrics`` on its own port (for non-HTTP services), in a daemon thread; returns
        the bound port.

        Every other path answers 404 (Prometheus' own server answers the metrics on any path): a
        readiness probe that reaches a metrics port by mistake (``/healthz`` of a service whose
        port another process took) must fail, not pass."""
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client.exposition import ThreadingWSGIServer

        metrics_app = make_wsgi_app(self.registry)

        def app(environ, start_response):  # type: ignore[no-untyped-def]
            if environ.get("PATH_INFO") == "/metrics":
                return metrics_app(environ, start_response)
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"dynamo_{self.service}: only /metrics is served here\n".encode()]

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(ThreadingWSGIServer):
            address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

        server = make_server(host, port, app, Server, handler_class=Quiet)
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return int(server.server_port)

    def snapshot(self) -> list[list[object]]:
        """Every sample now, ``[[name, {label: value}, value], ...]`` (``_created`` samples, the
        counters' creation times, left out)."""
        return _samples(self.registry.collect())


@dataclass(frozen=True)
class _Declared:
    """A metric declared on a :class:`MetricSet` class, made per instance in its registry."""

    kind: str
    name: str
    doc: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] | None = None

    def make(self, m: ServiceMetrics) -> Counter | Gauge | Histogram:
        if self.kind == "histogram":
            return m.histogram(self.name, self.doc, self.labels, self.buckets or LATENCY_BUCKETS)
        return getattr(m, self.kind)(self.name, self.doc, self.labels)


def counter(name: str, doc: str, *labels: str) -> Counter:
    """Declares ``dynamo_<service>_<name>`` (``name`` ends in ``_total``) on a :class:`MetricSet`;
    each instance gets its own :class:`~prometheus_client.Counter` under the attribute."""
    return cast(Counter, _Declared("counter", name, doc, labels))


def gauge(name: str, doc: str, *labels: str) -> Gauge:
    """Declares a gauge on a :class:`MetricSet` (see :func:`counter`)."""
    return cast(Gauge, _Declared("gauge", name, doc, labels))


def histogram(
    name: str, doc: str, *labels: str, buckets: Sequence[float] | None = None
) -> Histogram:
    """Declares a histogram on a :class:`MetricSet` (default buckets: ``LATENCY_BUCKETS``)."""
    return cast(Histogram, _Declared("histogram", name, doc, labels, tuple(buckets or ()) or None))


class MetricSet:
    """A service's metrics, declared once as class attributes and made per instance.

    ::

        class RewardMetrics(MetricSet):
            service = "reward"
            requests = counter("requests_total", "HTTP requests answered", "route", "code")

    Each instance has its own :class:`ServiceMetrics` (``metrics``: the registry, ``/metrics``,
    the run-folder history) and, under each declared attribute, the metric made in it, in the
    order declared (so ``/metrics`` lists them in that order). A subclass adds metrics made at run
    time (from a table) in its ``__init__`` after ``super().__init__()``.
    """

    service: ClassVar[str]

    def __init__(
        self, registry: CollectorRegistry | None = None, *, metrics: ServiceMetrics | None = None
    ) -> None:
        self.metrics = metrics if metrics is not None else ServiceMetrics(self.service, registry)
        declared = {}
        for cls in reversed(type(self).__mro__):
            declared.update({k: v for k, v in vars(cls).items() if isinstance(v, _Declared)})
        for attr, spec in declared.items():
            setattr(self, attr, spec.make(self.metrics))


def history_path(run_dir: str | Path, service: str, instance: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", instance) or "0"
    return Path(run_dir) / "metrics" / f"{service}-{safe}.jsonl"


class History:
    """A service's metrics, appended to a JSONL file while it runs.

    Each line is ``{"t": unix time, "service": ..., "instance": ..., "interval_s": ...,
    "samples": [[name, {labels}, value], ...]}``: the registry as ``/metrics`` would expose it at
    that moment (counters cumulative, histograms as ``_bucket``/``_sum``/``_count``), so rates come
    from consecutive lines exactly as from consecutive scrapes. Every line is flushed when written:
    a crash loses at most the last interval. Bounded size by downsampling: when the file grows past
    ``max_bytes`` every other line is dropped (the first and last kept; the file replaced
    atomically) and the interval doubles, so the file always spans the whole run at a coarser
    resolution instead of losing its beginning.
    """

    def __init__(self, metrics: Recorded, path: Path, interval_s: float, max_bytes: int) -> None:
        self.metrics = metrics
        self.path = path
        self.interval_s = interval_s
        self.max_bytes = max(max_bytes, 4096)
        self.instance = path.stem.split("-", 1)[1]
        self.downsamples = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write_once(self) -> None:
        samples = self.metrics.snapshot()
        if samples is None:  # a scraped target that did not answer: no line for this interval
            return
        line = json.dumps(
            {
                "t": time.time(),
                "service": self.metrics.service,
                "instance": self.instance,
                "interval_s": self.interval_s,
                "samples": samples,
            },
            separators=(",", ":"),
        )
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(line + "\n")
                f.flush()
            if self.path.stat().st_size > self.max_bytes:
                self._downsample()

    def _downsample(self) -> None:
        lines = self.path.read_text().splitlines(keepends=True)
        kept = lines[::2] if len(lines) % 2 else [*lines[:-1:2], lines[-1]]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, self.path)
        self.interval_s *= 2
        self.downsamples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            # A full or vanished disk must not take the service down.
            with contextlib.suppress(OSError):
                self.write_once()

    def start(self) -> History:
        self.write_once()
        self._thread = threading.Thread(target=self._run, name="metrics-history", daemon=True)
        self._thread.start()
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Stop recording after one last snapshot (also run at interpreter exit)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.write_once()


def exposition_samples(text: str) -> list[list[object]]:
    """Prometheus text format -> ``[[sample name, {labels}, value], ...]`` (a history line's
    samples; ``_created`` samples and non-finite values left out, as :meth:`ServiceMetrics.snapshot`
    does)."""
    from prometheus_client.parser import text_string_to_metric_families

    return _samples(text_string_to_metric_families(text))


def _samples(families: Iterable[Metric]) -> list[list[object]]:
    out: list[list[object]] = []
    for family in families:
        for s in family.samples:
            if s.name.endswith("_created") or not math.isfinite(s.value):
                continue
            out.append([s.name, dict(s.labels), float(s.value)])
    return out


@dataclass(eq=False)
class ScrapedMetrics(Recorded):
    """The history of a process that is not ours (a vLLM server): its ``/metrics`` at ``url``,
    scraped at each snapshot, under the service name ``service`` — the very samples Prometheus
    would scrape, so the run folder keeps them in the same schema. ``extra`` adds samples of our
    own (the engine's weight version, which vLLM's ``/metrics`` does not have); a scrape that
    fails writes no line (the target is restarting; the next interval tries again)."""

    service: str
    url: str
    extra: Callable[[], list[list[object]]] | None = None
    timeout_s: float = 5.0
    failures: int = field(default=0, init=False)  # scrapes that did not answer

    def snapshot(self) -> list[list[object]] | None:
        import urllib.request

        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as r:
                samples = exposition_samples(r.read().decode("utf-8", errors="replace"))
        except Exception:  # down, restarting, or a half-written answer
            self.failures += 1
            return None
        if self.extra is not None:
            with contextlib.suppress(Exception):
                samples += self.extra()
        return samples


def read_history(path: str | Path) -> list[dict[str, object]]:
    """The snapshots of a history file (a half-written last line is skipped)."""
    return read_records(path, "samples")


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
