"""``dynamo-rl dashboard``: serve the built-in dashboard of one run.

By default it watches what the experiment config points at: the run folder (``run.dir``: the
learner's metrics log, every service's metric history in ``metrics/``, the rollout workers'
sample logs in ``samples/``, ``up``'s evaluations), the trajectory stream of ``run.name`` in
``endpoints.redis_url``, and — when the run folder holds no metric history — the ``/metrics`` of
every service at its configured address. ``--scrape`` replaces that list (compose and Kubernetes
pass their service names); ``--no-redis`` reads samples only from the run folder. A run that
``up`` finished (``summary.json``) is shown as finished, entirely from its folder.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from dynamo_rl.cli import parse_config, service_parser

if TYPE_CHECKING:
    from dynamo_rl.config import ExperimentConfig

METRICS_LOG = "metrics.jsonl"


def default_targets(cfg: ExperimentConfig) -> list[str]:
    """The ``/metrics`` URL of every service, from the addresses in the config."""
    ep = cfg.endpoints
    urls = [f"{u.rstrip('/')}/metrics" for u in ep.engine_urls]
    urls.append(f"{ep.reward_url.rstrip('/')}/metrics")
    allocator_host = ep.allocator_addr.rsplit(":", 1)[0] or "127.0.0.1"
    ports = [
        (allocator_host, cfg.allocator.metrics_port),
        ("127.0.0.1", cfg.rollout.metrics_port),
        ("127.0.0.1", getattr(cfg.learner, "metrics_port", None)),
    ]
    # Port 0 means "a free one" to the service itself: there is nothing fixed to scrape.
    urls += [f"http://{host}:{port}/metrics" for host, port in ports if port]
    return urls


def build_parser() -> argparse.ArgumentParser:
    parser = service_parser("dashboard", "serve the built-in dashboard (charts and samples)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8265, help="port (0: a free one; default 8265)")
    parser.add_argument(
        "--metrics-log",
        metavar="FILE",
        help=f"learner JSONL metrics log (default: RUN_DIR/{METRICS_LOG})",
    )
    parser.add_argument(
        "--scrape",
        action="append",
        metavar="URL",
        help="a /metrics URL to scrape (repeatable; replaces the addresses from the config)",
    )
    parser.add_argument("--interval", type=float, default=2.0, help="scrape interval, seconds")
    parser.add_argument("--no-redis", action="store_true", help="do not read the stream")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from dashboard.server import Dashboard, make_server
    from dashboard.sources import JsonlLog, RunFolder, SampleReader, Scraper

    parser = build_parser()
    args, cfg = parse_config(parser, argv)
    if args.interval <= 0:
        parser.error("--interval must be positive")
    logging.basicConfig(level=cfg.run.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    log_path = Path(args.metrics_log or Path(cfg.run.run_dir) / METRICS_LOG)
    targets = args.scrape if args.scrape else default_targets(cfg)
    namespace = getattr(cfg.rollout, "namespace", None) or cfg.run.name
    adv = cfg.learner.algorithm.advantage
    estimator = getattr(adv, "registry_name", adv.type)
    dashboard = Dashboard(
        log=JsonlLog(log_path),
        scraper=Scraper(targets, interval=args.interval).start(),
        samples=None
        if args.no_redis
        else SampleReader(cfg.endpoints.redis_url, namespace, estimator=estimator),
        run_name=cfg.run.name,
        run=RunFolder(
            Path(cfg.run.run_dir), grpo_n=cfg.allocator.n_per_prompt, estimator=estimator
        ),
    )
    server = make_server(dashboard, args.host, args.port)
    host, port = server.server_address[:2]
    print(f"dynamo-rl dashboard: http://{host}:{port}/ (run {cfg.run.name})", flush=True)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever to return, so it must run outside the serving thread.
        import threading

        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        dashboard.scraper.stop()
        if dashboard.samples is not None:
            dashboard.samples.close()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
