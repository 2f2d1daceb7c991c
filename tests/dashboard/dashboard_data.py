"""Run data for the dashboard tests: codec-encoded trajectory groups in a real Redis stream, a
learner JSONL metrics log, and the services' real metric classes serving ``/metrics``."""

from __future__ import annotations

import json
import math
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from dashboard.charts import CHARTS
from dynamo_rl.codec import Response, Timing, TrajectoryGroup, encode_entry
from dynamo_rl.contracts.step_allocation import StepAllocation
from dynamo_rl.keys import trajectory_stream, weight_version_key
from dynamo_rl.metrics import CONTENT_TYPE_LATEST, ServiceMetrics
from tests.deploy.registry import METRIC_CLASSES, service_registry

SOURCES = ("arith", "gsm8k")


def write_stream(redis_url: str, namespace: str, groups: int = 12) -> list[TrajectoryGroup]:
    """XADD ``groups`` trajectory groups (alternating data sources, mixed rewards)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    written = []
    for g in range(groups):
        n = (4, 8, 12, 16)[g % 4]
        answer = 3 + g
        group = TrajectoryGroup(
            prompt_id=f"p{g:03d}",
            prompt_token_ids=[1, 2, 3],
            data_source=SOURCES[g % 2],
            namespace=namespace,
            prompt_text=f"What is {g} + 3?",
            weight_version=g // 4,
            allocated_n=n,
            priority=0.25 if g % 3 else -1.0,
            worker_id="w0",
            timing=Timing(created_unix=1.7e9 + g, generate_s=0.5, verify_s=0.01),
        )
        solved = (0.0, 0.25, 0.5, 0.75, 1.0)[g % 5]  # from unsolved to mastered prompts
        for i in range(n):
            correct = i < round(n * solved)
            group.responses.append(
                Response(
                    token_ids=[5, 6, 7, 8][: 1 + i % 4],
                    logprobs=[-0.5, -0.25, -1.0, -0.1][: 1 + i % 4],
                    reward=1.0 if correct else 0.0,
                    correct=correct,
                    format_ok=i % 5 != 4,
                    reason="ok" if correct else ("no_answer" if i % 5 == 4 else "wrong_answer"),
                    finish_reason="stop",
                    text=f"The answer is {answer if correct else answer + 1 + i}.",
                )
            )
        client.xadd(trajectory_stream(namespace), encode_entry(group))
        written.append(group)
    client.set(weight_version_key(namespace), 3)
    client.close()
    return written


def learner_record(step: int) -> dict[str, float]:
    """A step record shaped like the learner's (the keys its JSONL log and gauges share)."""
    rng = random.Random(step)
    return {
        "step": step,
        "loss": 0.5 * math.exp(-step / 20) + 0.02 * rng.random(),
        "policy_loss": 0.4 * math.exp(-step / 20),
        "kl": 0.001 * step,
        "approx_kl": 0.0005 * step + 0.0002 * rng.random(),
        "opd_reverse_kl": 0.5 / step,
        "entropy": 1.2 - 0.01 * step,
        "beta_stab_mean": 0.9 + 0.05 * math.sin(step / 3),
        "beta_comp_mean": 1.05 + 0.03 * math.cos(step / 4),
        "reward_mean": min(1.0, 0.2 + 0.015 * step + 0.05 * rng.random()),
        "accuracy_mean": min(1.0, 0.15 + 0.015 * step),
        "staleness_mean": rng.choice((0.0, 0.5, 1.0)),
        "mismatch_kl_token_mean": 0.01 + 0.005 * rng.random(),
        "mismatch_kl_seq_mean": 0.012 + 0.005 * rng.random(),
        f"mismatch_kl_lag{step % 2}": 0.01 * (1 + step % 2),
        **{f"is_weight_p{q}": 0.5 + q / 100 for q in (1, 10, 50, 90, 99)},
        "is_masked_share": 0.02 * rng.random(),
        "equal_reward_streak": step % 3,
        "grad_alloc_corr": 0.5 + 0.3 * math.sin(step / 5),
        "grad_var_ratio": 0.8 + 0.1 * rng.random(),
        "grad_zero_adv_share": 0.3 * rng.random(),
        "push_seconds": 0.3 + 0.05 * rng.random(),
        "push_bytes": 3_748_128,
        "weight_version": step,
        "time_read": 0.02 + 0.01 * rng.random(),
        "time_forward": 0.4 + 0.05 * rng.random(),
        "time_backward": 0.8 + 0.1 * rng.random(),
        "time_optimizer": 0.1,
        "groups": 8,
        "tokens": 2048,
        "gen_tokens_kept": 2048,
        "gen_tokens_dropped": rng.randrange(0, 1024),
        **StepAllocation(above=3, at=2, below=3, skipped=rng.randrange(0, 3)).record(),
    }


def write_metrics_log(path: Path, steps: int = 40) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps({"time_unix": 1.7e9 + step, **learner_record(step)}) + "\n")


def _chart_labels() -> dict[str, list[dict[str, str]]]:
    """metric family name -> the label sets the charts filter on (so fed data matches them)."""
    out: dict[str, list[dict[str, str]]] = {}
    for chart in CHARTS:
        for s in chart.series:
            if s.labels:
                for name in (s.metric, s.per or s.metric):
                    base = name.removesuffix("_sum").removesuffix("_count").removesuffix("_total")
                    out.setdefault(base, []).append(s.labels)
    return out


def _metric_objects(instance: object) -> Iterator[MetricWrapperBase]:
    for value in vars(instance).values():
        if isinstance(value, MetricWrapperBase):
            yield value
        elif isinstance(value, dict):
            yield from (v for v in value.values() if isinstance(v, MetricWrapperBase))


def _feed(metric: MetricWrapperBase, labels: dict[str, list[dict[str, str]]], rng: random.Random):
    kind = metric._type  # "counter" | "gauge" | "histogram" | ...
    children: list[MetricWrapperBase] = [metric]
    if metric._labelnames:
        wanted = labels.get(metric._name, [])
        label_sets = [d for d in wanted if set(d) <= set(metric._labelnames)] or [{}]
        children = [
            metric.labels(**{n: d.get(n, "ok") for n in metric._labelnames}) for d in label_sets
        ]
    for child in children:
        if kind == "counter":
            child.inc(rng.randint(1, 50))
        elif kind == "gauge":
            child.set(rng.random())
        elif kind == "histogram":
            bounds = [b for b in child._upper_bounds if math.isfinite(b)]
            for _ in range(5):
                child.observe(rng.choice(bounds) * rng.uniform(0.6, 1.0))


def _metrics_server(metrics: ServiceMetrics) -> ThreadingHTTPServer:
    """``/metrics`` of one registry on a free loopback port (stopped by the caller)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = metrics.exposition()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@contextmanager
def serving_service_metrics(engines: int = 2) -> Iterator[list[str]]:
    """Serve every service's metric classes, fed with changing values; yields their URLs."""
    registries = {s: service_registry(s) for s in METRIC_CLASSES}
    instances: list[object] = []
    for service, reg in registries.items():
        instances += reg.instances
        if service == "engine":  # more engine replicas: the per-engine chart splits by target
            instances += [type(reg.instances[0])() for _ in range(engines - 1)]
    servers = [_metrics_server(i.metrics) for i in instances]  # type: ignore[attr-defined]
    urls = [f"http://127.0.0.1:{s.server_address[1]}/metrics" for s in servers]
    labels = _chart_labels()
    stop = threading.Event()

    def feed() -> None:
        rng = random.Random(0)
        while not stop.is_set():
            for instance in instances:
                for metric in _metric_objects(instance):
                    _feed(metric, labels, rng)
            stop.wait(0.2)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    try:
        yield urls
    finally:
        stop.set()
        thread.join(timeout=5)
        for server in servers:
            server.shutdown()
            server.server_close()
