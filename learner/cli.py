"""``dynamo-rl learner``: train on the trajectory stream (launch with torchrun for several ranks).

    torchrun --nproc-per-node 2 -m dynamo_rl.cli learner --config configs/dynamo_grpo.yaml \
        learner.model=/path/to/hf_model

Without torchrun it runs as a single rank. The config is parsed and checked before torch is
imported, so ``--help`` and config mistakes answer at once (exit 2).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dynamo_rl.cli import EXIT_CONFIG, parse_config, service_parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = service_parser(
        "learner",
        "Train on the trajectory stream with FSDP2; launch several ranks with "
        "'torchrun --nproc-per-node N -m dynamo_rl.cli learner ...' (one rank without torchrun).",
    )
    parser.add_argument("--model", dest="learner.model", metavar="DIR",
                        help="Hugging Face model directory (learner.model)")  # fmt: skip
    parser.add_argument("--max-steps", dest="learner.max_steps", metavar="N",
                        help="stop after N train steps (learner.max_steps)")  # fmt: skip
    _args, cfg = parse_config(parser, argv)
    lc = cfg.learner
    error = None
    if lc.model is None:
        error = "learner.model: required (a Hugging Face model directory), e.g. learner.model=DIR"
    elif not (Path(lc.model) / "config.json").is_file():
        error = (
            f"learner.model: {lc.model!r} is not a Hugging Face model directory (no config.json)"
        )
    if error is None and lc.mode != "rl":
        from learner.offline_data import check_data_paths

        error = check_data_paths(lc.data)
    if error:
        print(f"dynamo-rl learner: {error}", file=sys.stderr)
        return EXIT_CONFIG
    _die_with_launcher()
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=cfg.run.log_level.upper(),
        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s: %(message)s",
    )
    # Import torch only now: --help and config errors stay fast.
    import torch.distributed as dist

    from learner.trainer import Trainer

    trainer: Trainer
    if lc.mode == "rl":
        from learner.rl import RLTrainer

        trainer = RLTrainer(cfg)
    else:  # sft, dpo: offline data (learner.data), see learner/offline.py
        from learner.offline import MODES

        trainer = MODES[lc.mode](cfg)
    try:
        return trainer.run()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _die_with_launcher() -> None:
    """Under torchrun, end this rank when the launcher dies (even by SIGKILL).

    torchrun starts each rank in its own session, so killing the launcher alone would leave
    orphaned ranks training on, holding stream entries and pushing weights."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() == 1:  # the launcher died before the line above
        os._exit(1)
