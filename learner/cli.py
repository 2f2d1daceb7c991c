"""``dynamo-rl learner``: train on the trajectory stream (launch with torchrun for several ranks).

    torchrun --nproc-per-node 2 -m dynamo_rl.cli learner --config configs/dynamo_grpo.yaml \
        learner.model=/path/to/hf_model

Without torchrun it runs as a single rank. The config is parsed and checked before torch is
imported, so ``--help`` and config mistakes answer at once (exit 2).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from dynamo_rl.cli import EXIT_CONFIG, parse_config, service_parser

if TYPE_CHECKING:
    from dynamo_rl.config import ExperimentConfig
    from learner.trainer import Trainer


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
    if error is None:
        from dynamo_rl.trackers import missing_packages

        error = missing_packages(lc.trackers)
    if error:
        print(f"dynamo-rl learner: {error}", file=sys.stderr)
        return EXIT_CONFIG

    def build() -> Trainer:
        if lc.mode == "rl":
            from learner.rl import RLTrainer

            return RLTrainer(cfg)
        from learner.offline import MODES  # sft, dpo: offline data (learner.data)

        return MODES[lc.mode](cfg)

    return run_ranks(cfg, build)


def run_ranks(
    cfg: ExperimentConfig,
    build: Callable[[], Trainer],
    after: Callable[[Trainer], None] | None = None,
) -> int:
    """Run one rank: set up logging, build the trainer, run it, then leave the group in order.

    ``after`` runs on every rank once training has returned. On success every rank waits for the
    others (a barrier) before the process group is destroyed: a rank that tears gloo down while a
    peer still talks to it can abort ("terminate called without an active exception"). Under
    torchrun a rank that finished then ends at once (:func:`_end_rank`)."""
    _die_with_launcher()
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=cfg.run.log_level.upper(),
        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s: %(message)s",
    )
    # Import torch only now: --help and config errors stay fast.
    import torch.distributed as dist

    finished = False
    try:
        trainer = build()
        code = trainer.run()
        if after is not None:
            after(trainer)
        finished = True
    finally:
        if dist.is_initialized():
            if finished:
                try:
                    dist.barrier()
                except Exception as e:  # a peer already gone: nothing left to wait for
                    logging.getLogger(__name__).warning("final barrier failed: %s", e)
            dist.destroy_process_group()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        _end_rank(code)
    return code


def _end_rank(code: int) -> NoReturn:
    """End a torchrun rank that finished, without the interpreter's teardown.

    The exit handlers run (the metrics history's last snapshot, trackers, logging), the output is
    flushed, then the process ends with ``os._exit``. Tearing down the interpreter and torch's
    native state after a run once aborted a rank that had trained and left its group in order
    (SIGABRT, "terminate called without an active exception"), so torchrun reported a failed
    run; a finished rank has nothing left that needs that teardown."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


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
