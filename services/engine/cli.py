"""``dynamo-rl engine``: serve a Hugging Face model with the embedded inference engine.

The config is parsed (and the bind address checked) before torch is imported, so ``--help`` and
config mistakes answer at once.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from dynamo_rl.cli import (
    EXIT_CONFIG,
    add_bind_flags,
    log_to_stderr,
    parse_config,
    refuse_open_bind,
    service_parser,
)


def _parser() -> argparse.ArgumentParser:
    p = service_parser(
        "engine",
        "Serve a Hugging Face causal LM: OpenAI /v1/completions, SGLang /generate, and "
        "SGLang- and vLLM-shaped weight control (control endpoints need DYNAMO_CONTROL_TOKEN "
        "when set).",
    )
    p.add_argument(
        "--model", dest="engine.model", metavar="DIR", help="model directory (engine.model)"
    )
    add_bind_flags(p, "engine", port=8000)
    p.add_argument(
        "--dtype",
        dest="engine.dtype",
        metavar="DTYPE",
        help="float32 | bfloat16 | float16 | auto (engine.dtype)",
    )
    p.add_argument(
        "--device", dest="engine.device", metavar="DEVICE", help="cpu | cuda (engine.device)"
    )
    p.add_argument(
        "--max-batch-size",
        dest="engine.max_batch_size",
        type=int,
        metavar="N",
        help="sequences decoded together (engine.max_batch_size, default 64)",
    )
    p.add_argument(
        "--served-model-name",
        dest="engine.served_model_name",
        metavar="NAME",
        help="name in /v1/models (engine.served_model_name)",
    )
    p.add_argument(
        "--threads",
        dest="engine.threads",
        type=int,
        metavar="N",
        help="torch threads (engine.threads)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    _args, cfg = parse_config(parser, argv)
    ecfg = cfg.engine
    if ecfg.model is None:
        print("dynamo-rl engine: engine.model: required (--model DIR)", file=sys.stderr)
        return EXIT_CONFIG
    if not (Path(ecfg.model) / "config.json").is_file():
        print(
            f"dynamo-rl engine: engine.model: {ecfg.model!r} is not a Hugging Face model "
            "directory (no config.json)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    token = cfg.endpoints.control_token
    token_value = token.get_secret_value() if token is not None else None
    refuse_open_bind("engine", "engine.host", ecfg.host, token_value)
    log_to_stderr(cfg.run.log_level)
    log = logging.getLogger("dynamo_rl.engine")

    # Bind first so port 0 resolves to a real port before anything registers it.
    family = socket.AF_INET6 if ":" in ecfg.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((ecfg.host, ecfg.port))
    except OSError as e:
        print(f"dynamo-rl engine: engine.port: cannot bind {ecfg.host}:{ecfg.port}: {e}",
              file=sys.stderr)  # fmt: skip
        return 1
    port = sock.getsockname()[1]

    import torch
    import uvicorn

    from dynamo_rl.contracts.engine import EnginePulse, EngineRegistry
    from services.engine.app import create_app
    from services.engine.engine import Engine, load_model

    if ecfg.threads:
        torch.set_num_threads(ecfg.threads)
    torch.manual_seed(cfg.run.seed)
    model, tokenizer = load_model(ecfg.model, ecfg.dtype, ecfg.device)
    name = ecfg.served_model_name or Path(ecfg.model).resolve().name
    registry = pulse = None
    if ecfg.register_in_redis:
        shown = "127.0.0.1" if ecfg.host in ("0.0.0.0", "::") else ecfg.host
        url = ecfg.advertise_url or f"http://{shown}:{port}"
        registry = EngineRegistry(cfg.endpoints.redis_url, cfg.run.name, url)
        # Raised from inside this process: a SIGSTOP or a hung host stops it.
        pulse = EnginePulse(cfg.endpoints.redis_url, cfg.run.name, url)
    engine = Engine(
        model, tokenizer, ecfg, name, token_value, registry, seed=cfg.run.seed,
        interruptible=cfg.rollout.update_mode == "interrupt",
    )  # fmt: skip
    app = create_app(engine)
    engine.metrics.metrics.record_run(cfg.run, str(port))
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "serving %s (%.1fM parameters, %s, %s) on http://%s:%d",
        name, n_params / 1e6, ecfg.dtype, ecfg.device, ecfg.host, port,
    )  # fmt: skip
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=cfg.run.log_level, access_log=False, lifespan="on")
    )
    if pulse is not None:
        pulse.start()
    try:
        server.run(sockets=[sock])
    finally:
        if pulse is not None:
            pulse.stop()
    return 0
