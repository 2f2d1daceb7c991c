"""The ``dynamo-rl`` command line: one subcommand per service.

The top level knows each subcommand only by name, a one-line help and the module that implements
it (``SUBCOMMANDS``); that module is imported inside the subcommand that runs it, so ``dynamo-rl
--help`` never imports torch. Every service module exposes ``main(argv) -> int`` and builds its
parser with :func:`service_parser`, which gives all of them the same ``--config FILE`` and
``key.sub=value`` overrides; a flag whose ``dest`` is a dotted key (``dest="allocator.port"``) is an
override too. Config mistakes print one clear message and exit 2 without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dynamo_rl.config import ExperimentConfig

# name -> (module implementing main(argv), one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "allocator": ("allocator.cli", "serve Dynamic Rollout Allocation over gRPC"),
    "reward": ("services.reward.cli", "serve math verification and sandboxed code tests over HTTP"),
    "engine": ("services.engine.cli", "serve a model with the embedded inference engine"),
    "vllm-server": (
        "services.engine.vllm_server",
        "run a vLLM server (engine.kind=vllm) from the vLLM environment, registered in Redis",
    ),
    "rollout": ("services.rollout.cli", "run a rollout worker (dataset -> engines -> stream)"),
    "learner": ("learner.cli", "train on the trajectory stream (launch with torchrun)"),
    "up": ("launcher.up", "start every service locally and train"),
    "eval": (
        "services.rollout.eval_cli",
        "measure pass@1 / avg@k of a model through the reward service",
    ),
    "config": ("dynamo_rl.config_cli", "validate an experiment config and print it resolved"),
    "dashboard": ("dashboard.cli", "serve the built-in dashboard (charts and samples)"),
    "init-model": ("learner.tiny_model", "build a tiny Qwen2 model and tokenizer (no download)"),
    "sft": ("learner.sft_cli", "supervised fine-tuning (the learner's sft mode; warm start)"),
    "stage": (
        "launcher.stage",
        "run one stage of up's recipe on its own: prepare | eval-before | eval-after (compose)",
    ),
    "task": ("tasks.cli", "write a built-in task's train/test data (verl parquet layout)"),
    "data": (
        "tasks.convert",
        "convert a published dataset (GSM8K, MATH, AIME, APPS, ...) into the verl layout",
    ),
}

EXIT_CONFIG = 2


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a server reachable from this machine only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def add_bind_flags(
    parser: argparse.ArgumentParser,
    section: str,
    *,
    port: int,
    host: str = "127.0.0.1",
    what: str = "port",
) -> None:
    """``--host`` and ``--port`` for a server bound at ``<section>.host:<section>.port``; ``host``
    and ``port`` are the config's defaults, shown in the help (``tests/dynamo_rl/test_cli.py``
    holds them to the config)."""
    parser.add_argument(
        "--host",
        dest=f"{section}.host",
        metavar="HOST",
        help=f"address to bind ({section}.host, default {host})",
    )
    parser.add_argument(
        "--port",
        dest=f"{section}.port",
        type=int,
        metavar="PORT",
        help=f"{what}, 0 for a free one ({section}.port, default {port})",
    )


def refuse_open_bind(prog: str, key: str, host: str, token: str | None) -> None:
    """Exit 2 with the reason when a service with control routes would be reachable from other
    machines (``host``, config key ``key``, is not loopback) without a control token."""
    if is_loopback(host) or token:
        return
    print(
        f"dynamo-rl {prog}: {key}: refusing to bind {host!r} (not loopback) without a control "
        "token; set endpoints.control_token (DYNAMO_CONTROL_TOKEN) or bind 127.0.0.1",
        file=sys.stderr,
    )
    raise SystemExit(EXIT_CONFIG)


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_to_stderr(level: str, fmt: str = LOG_FORMAT) -> None:
    """A service's log lines on stderr at ``level`` (``run.log_level``)."""
    import logging

    logging.basicConfig(level=level.upper(), format=fmt)


def service_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A subcommand's parser with ``--config`` and trailing ``key.sub=value`` overrides."""
    parser = argparse.ArgumentParser(
        prog=f"dynamo-rl {prog}",
        description=description,
        epilog="Overrides: any config key as KEY=VALUE, e.g. learner.lr=1e-6 run.seed=1. "
        "Addresses also come from REDIS_URL, ALLOCATOR_ADDR, REWARD_URL, ENGINE_URLS.",
    )
    parser.add_argument("--config", metavar="FILE", help="experiment YAML (a section per service)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    return parser


def parse_config(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, ExperimentConfig]:
    """Parse ``argv`` and build the experiment config; a config mistake exits 2 with its message."""
    from dynamo_rl.config import ConfigError, load_config

    # Intermixed: overrides may come before and after flags (``a=1 --port 5 b=2``), as a command
    # line assembled from parts (the service table's port overrides) has them.
    args = parser.parse_intermixed_args(argv)
    overrides = list(args.overrides)
    for dest, value in vars(args).items():
        if "." in dest and value is not None:
            # A flag's text is taken literally (quoted for the YAML parse of overrides), so that
            # `--host ::` or `--served-model-name yes` stay strings; pydantic still turns "8" into 8.
            text = json.dumps(value) if isinstance(value, str) else value
            overrides.append(f"{dest}={text}")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"dynamo-rl {parser.prog.split()[-1]}: {e}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    return args, cfg


def _top_parser() -> argparse.ArgumentParser:
    from dynamo_rl import __version__

    parser = argparse.ArgumentParser(
        prog="dynamo-rl",
        description="DynaMO-RL: RL for language models with verifiable rewards, as services.",
        epilog="Run 'dynamo-rl COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"dynamo-rl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        parser = _top_parser()
        if not argv:
            parser.print_help()
            return 0
        parser.parse_args(argv[:1])  # prints help/version or the unknown-command error
        return 0
    name, rest = argv[0], argv[1:]
    module_name = SUBCOMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            print(f"dynamo-rl {name}: not available in this build ({module_name} is missing)",
                  file=sys.stderr)  # fmt: skip
            return 1
        raise
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
