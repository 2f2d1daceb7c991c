"""``dynamo-rl reward``: serve math, code, reward-model and judge scoring (and composites) over HTTP.

Parses the config before importing FastAPI or math-verify, so ``--help`` is instant. Before the
server starts, the sandbox is tried once: if bubblewrap is missing or cannot create namespaces,
the command exits 1 with the reason, unless ``--unsafe-no-sandbox`` was given (logged loudly) or
code execution is switched off (``reward.code.enabled=false``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from dynamo_rl.cli import add_bind_flags, log_to_stderr, service_parser

log = logging.getLogger("services.reward")

_BANNER = "!" * 78


def build_parser() -> argparse.ArgumentParser:
    parser = service_parser(
        "reward",
        "Serve POST /v1/verify (math, code, model and judge items; composite rewards per "
        "data source), POST /run_code (SandboxFusion subset), "
        "GET /healthz, GET /metrics; OpenAPI at /docs.",
    )
    add_bind_flags(parser, "reward", port=8080)
    parser.add_argument(
        "--math-workers",
        dest="reward.math.workers",
        type=int,
        metavar="N",
        help="math-verify worker processes (default: one per CPU)",
    )
    parser.add_argument(
        "--sandbox-concurrency",
        dest="reward.code.concurrency",
        type=int,
        metavar="N",
        help="sandboxes running at once (default 2)",
    )
    parser.add_argument(
        "--unsafe-no-sandbox",
        dest="reward.code.unsafe_no_sandbox",
        action="store_const",
        const=True,
        default=None,
        help="run code WITHOUT bubblewrap isolation (rlimits and a temp dir only): "
        "for hosts without user namespaces and trusted code only",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from dynamo_rl.cli import parse_config

    parser = build_parser()
    _args, exp = parse_config(parser, argv)
    cfg = exp.reward
    log_to_stderr(exp.run.log_level)
    from pathlib import Path

    for name, spec in cfg.models.items():
        if not Path(spec.path).is_dir():
            print(
                f"dynamo-rl reward: reward.models.{name}.path: {spec.path!r} is not a directory "
                "(a Hugging Face sequence-classification model saved with save_pretrained)",
                file=sys.stderr,
            )
            return 1

    from services.reward.sandbox import Sandbox, SandboxUnavailable

    if cfg.code.enabled:
        if cfg.code.unsafe_no_sandbox:
            log.warning(
                "%s\nreward: --unsafe-no-sandbox: code runs WITHOUT bubblewrap isolation. Programs"
                " can read host files, use the network and see other processes. Use this only "
                "for trusted code.\n%s",
                _BANNER,
                _BANNER,
            )
        sandbox = Sandbox(
            cfg.code.bwrap, cfg.code.uid, cfg.code.ro_paths, cfg.code.unsafe_no_sandbox
        )
        try:
            sandbox.check()
        except SandboxUnavailable as e:
            print(
                f"dynamo-rl reward: refusing to run code: {e}.\n"
                "  Fix the sandbox (install bubblewrap; allow unprivileged user namespaces), or "
                "start with --unsafe-no-sandbox (no isolation), or serve math only with "
                "reward.code.enabled=false.",
                file=sys.stderr,
            )
            return 1

    import uvicorn

    from dynamo_rl.notices import Notices
    from services.reward.app import create_app
    from services.reward.metrics import RewardMetrics

    metrics = RewardMetrics()
    metrics.metrics.record_run(exp.run, "0")
    app = create_app(cfg, metrics, Notices(exp.run.run_dir, "reward"))
    log.info(
        "reward service on http://%s:%d (kinds: %s)",
        cfg.host,
        cfg.port,
        ", ".join(app.state.scorers),
    )
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=exp.run.log_level, access_log=False)
    return 0
