"""``dynamo-rl allocator``: serve Dynamic Rollout Allocation over gRPC.

Parses the config first and imports the server (grpc, redis, numpy) afterwards, so ``--help``
answers at once. Runs until SIGTERM or SIGINT, then drains in-flight calls for two seconds.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence

from dynamo_rl.cli import (
    add_bind_flags,
    log_to_stderr,
    parse_config,
    refuse_open_bind,
    service_parser,
)
from dynamo_rl.redis_client import redact_url


def build_parser() -> argparse.ArgumentParser:
    parser = service_parser(
        "allocator",
        "Serve Dynamic Rollout Allocation (dynamo.v1.Allocator) over gRPC, with per-prompt "
        "success statistics in Redis, the gRPC health service and server reflection.",
    )
    parser.add_argument(
        "--redis-url",
        dest="endpoints.redis_url",
        metavar="URL",
        help="Redis holding the statistics (endpoints.redis_url; env REDIS_URL)",
    )
    add_bind_flags(parser, "allocator", port=50051, what="gRPC port")
    parser.add_argument(
        "--metrics-port",
        dest="allocator.metrics_port",
        type=int,
        metavar="PORT",
        help="Prometheus /metrics port, 0 for a free one (allocator.metrics_port, default 9101)",
    )
    parser.add_argument(
        "--decay",
        dest="allocator.decay",
        type=float,
        metavar="D",
        help="statistics decay in (0, 1] (allocator.decay, default 1: keep all history)",
    )
    return parser  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    _args, cfg = parse_config(parser, argv)
    token = cfg.endpoints.control_token
    token_value = token.get_secret_value() if token is not None else None
    # ResetNamespace wipes a run's statistics: never expose it unauthenticated.
    refuse_open_bind("allocator", "allocator.host", cfg.allocator.host, token_value)
    log_to_stderr(cfg.run.log_level)
    from allocator.metrics import AllocatorMetrics
    from allocator.server import start_server
    from allocator.stats import StatsStore

    acfg = cfg.allocator
    store = StatsStore.from_url(
        cfg.endpoints.redis_url,
        decay=acfg.decay,
        timeout_s=acfg.redis_timeout_s,
        half_life=acfg.stats_half_life,
    )
    metrics = AllocatorMetrics()
    running = start_server(acfg, store, metrics, control_token=token_value)
    metrics_port = metrics.metrics.serve(acfg.metrics_port, acfg.host)
    metrics.metrics.record_run(cfg.run, "0")
    print(
        f"allocator listening on {acfg.host}:{running.port} (metrics on :{metrics_port}, "
        f"redis {redact_url(cfg.endpoints.redis_url)})",
        flush=True,
    )
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    done.wait()
    running.stop(grace=2.0)
    return 0
