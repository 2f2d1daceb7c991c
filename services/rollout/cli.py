"""``dynamo-rl rollout``: run one rollout worker (dataset → allocator → engines → reward → stream);
with ``--check-data FILE``, only load the dataset and write what the worker would train on; with
``--write-answers FILE`` (``rollout.env.name: verifiers``), only write the environment's rows with
their answers as supervised rows (``dynamo-rl up``'s warm start).

The config is parsed before anything heavy is imported, so ``--help`` and config mistakes answer at
once. SIGTERM/SIGINT stop the worker between or inside a batch; a batch is pushed atomically
(one Lua script), so an interrupted batch leaves nothing half-written in the stream.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dynamo_rl.cli import parse_config, service_parser

if TYPE_CHECKING:
    from dynamo_rl.config import ExperimentConfig

STOP_RETRY_S = 0.5
"""How often a stop signal's cancellation is repeated until the worker has ended."""


def cancel_until_done(task: asyncio.Future[object], every_s: float) -> None:
    """Cancel ``task``, and again every ``every_s`` seconds until it is done.

    One cancellation can be lost: Python 3.11's ``asyncio.wait_for`` (which the Redis client wraps
    every command in) returns the result instead of raising when the cancellation arrives just as
    the awaited call completes, and the worker then waits on; a SIGTERM once went unanswered for
    over 30 s that way in CI."""
    if task.done():
        return
    task.cancel()
    asyncio.get_running_loop().call_later(every_s, cancel_until_done, task, every_s)


def build_parser() -> argparse.ArgumentParser:
    parser = service_parser(
        "rollout",
        "Run a rollout worker: take prompt batches, get counts from the allocator, sample on the "
        "engines (endpoints.engine_urls), score with the reward service and push one trajectory "
        "group per prompt to the Redis stream.",
    )
    parser.add_argument(
        "--dataset", dest="rollout.dataset", metavar="FILE", help="prompts (JSONL or verl parquet)"
    )
    parser.add_argument(
        "--tokenizer", dest="rollout.tokenizer", metavar="DIR",
        help="tokenizer directory (default: engine.model)",
    )  # fmt: skip
    parser.add_argument(
        "--num-batches", dest="rollout.num_batches", type=int, metavar="N",
        help="stop after N batches (0: run until stopped)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-port", dest="rollout.metrics_port", type=int, metavar="PORT",
        help="Prometheus /metrics port (0: a free one)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-host", dest="rollout.metrics_host", metavar="ADDR",
        help="address /metrics binds (default 127.0.0.1; 0.0.0.0 in containers)",
    )  # fmt: skip
    parser.add_argument(
        "--check-data", metavar="FILE",
        help="load the dataset as the worker would, write what it will train on (rows kept and "
        "dropped, data sources and their scorers, context, max_tokens) as JSON to FILE, and exit",
    )  # fmt: skip
    parser.add_argument(
        "--write-answers", metavar="FILE",
        help="rollout.env.name verifiers: write the environment's rows (prompt, extra_info.answer: "
        "its answer) as parquet to FILE, what `dynamo-rl sft` trains on, and exit",
    )  # fmt: skip
    return parser


def write_answers(cfg: ExperimentConfig, out: str) -> int:
    """``--write-answers``: :func:`services.rollout.verifiers_worker.answer_rows` as parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if cfg.rollout.env.name != "verifiers":
        print("dynamo-rl rollout: --write-answers needs rollout.env.name 'verifiers'; "
              f"got {cfg.rollout.env.name!r}", file=sys.stderr)  # fmt: skip
        return 2
    from services.rollout.verifiers_worker import answer_rows

    try:
        rows = answer_rows(cfg)
    except ValueError as e:
        print(f"dynamo-rl rollout: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("dynamo-rl rollout: the verifiers environment's rows have no answer to write",
              file=sys.stderr)  # fmt: skip
        return 2
    pq.write_table(pa.Table.from_pylist(rows), out)
    return 0


def check_data(cfg: ExperimentConfig, out: str) -> int:
    """``--check-data``: the dataset summary (:func:`services.rollout.data_check.data_summary`)."""
    import json
    from pathlib import Path

    from services.rollout.data_check import data_summary
    from services.rollout.datasets import DatasetError

    try:
        summary = data_summary(cfg)
    except (ValueError, DatasetError, OSError) as e:
        print(f"dynamo-rl rollout: {e}", file=sys.stderr)
        return 2
    Path(out).write_text(json.dumps(summary, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args, cfg = parse_config(build_parser(), argv)

    import logging
    import signal

    logging.basicConfig(
        level=cfg.run.log_level.upper(),
        format="%(asctime)s %(levelname)s rollout %(name)s: %(message)s",
    )
    log = logging.getLogger("services.rollout.cli")
    if args.check_data:
        return check_data(cfg, args.check_data)
    if args.write_answers:
        return write_answers(cfg, args.write_answers)

    from dynamo_rl.notices import Notices
    from services.rollout.datasets import DatasetError
    from services.rollout.engines import EngineError
    from services.rollout.metrics import WorkerMetrics
    from services.rollout.reward_client import RewardRequestError, RewardUnavailable
    from services.rollout.worker import build_worker

    metrics = WorkerMetrics()
    try:
        worker = build_worker(cfg, metrics, Notices(cfg.run.run_dir, "rollout"))
    except (ValueError, DatasetError, OSError) as e:
        print(f"dynamo-rl rollout: {e}", file=sys.stderr)
        return 2
    port = metrics.metrics.serve(cfg.rollout.metrics_port, cfg.rollout.metrics_host)
    metrics.metrics.record_run(cfg.run, worker.worker_id)
    if cfg.rollout.sample_log_mb > 0:
        from dynamo_rl.sample_log import SampleLog

        worker.sample_log = SampleLog.in_run(
            cfg.run.run_dir, worker.worker_id, cfg.rollout.sample_log_mb
        )
    log.info(
        "worker %s: namespace %s, %d engine(s), metrics on :%d",
        worker.worker_id, worker.namespace, len(worker.pool.urls), port,
    )  # fmt: skip

    async def run() -> int:
        loop = asyncio.get_running_loop()
        work = asyncio.ensure_future(worker.run())

        def stop(sig: signal.Signals) -> None:
            log.info("%s: stopping", sig.name)
            cancel_until_done(work, STOP_RETRY_S)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig)
        try:
            done = await work
            log.info("done: %d batches", done)
            return 0
        except asyncio.CancelledError:
            log.info("stopped after %d batches", worker.batches_done)
            return 0
        except (EngineError, RewardRequestError, RewardUnavailable, DatasetError) as e:
            log.error("stopping: %s", e)
            return 1
        finally:
            await worker.aclose()

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
