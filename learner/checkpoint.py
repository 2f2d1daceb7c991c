"""Checkpoints: ``torch.distributed.checkpoint`` for the sharded model and optimizer, plus a small
JSON trainer state and per-rank RNG states.

Layout, one folder per step (``step_000010/``)::

    __0_0.distcp ...        model + optimizer shards (DCP, resharding-safe); with LoRA the
                            model part is the adapters alone (the base is learner.model)
    trainer_state.json      step, weight version, scheduler, consumed entry ids, extras
    rng_rank{r}.pt          that rank's torch (and CUDA) RNG state
    COMMITTED               written last; a folder without it is ignored (a crash mid-save)

The trainer state's ``consumed`` lists the stream ids trained on since the previous checkpoint;
they are acknowledged only after ``COMMITTED`` exists (see ``dynamo_rl.contracts.stream``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from learner.model import trainable_entries

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
MARKER = "COMMITTED"


class CheckpointManager:
    """``trainable_only``: the model part holds only the parameters that train (a LoRA policy's
    adapters; the frozen base is reloaded from ``learner.model`` at every start)."""

    def __init__(self, root: str | Path, keep: int, trainable_only: bool = False) -> None:
        self.root = Path(root)
        self.keep = keep
        self.options = StateDictOptions(
            ignore_frozen_params=trainable_only, strict=not trainable_only
        )

    def dir_for(self, step: int) -> Path:
        return self.root / f"step_{step:06d}"

    def committed(self) -> list[tuple[int, Path]]:
        if not self.root.exists():
            return []
        found = []
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and (p / MARKER).exists():
                found.append((int(m.group(1)), p))
        return sorted(found)

    def latest(self) -> tuple[int, Path] | None:
        found = self.committed()
        return found[-1] if found else None

    def load_latest(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[int, Path, dict[str, Any]] | None:
        """Collective: load the newest committed checkpoint that loads; returns (step, path,
        trainer state), or None when there is none.

        A committed checkpoint damaged afterwards (truncated shard, bad JSON, missing metadata) is
        refused with an error in the log and the one before it is used; the steps after it are
        then trained again on new data (the entries they consumed were acknowledged when it
        committed). If every committed checkpoint is damaged the learner stops with a clear error
        rather than silently starting from scratch.
        """
        found = self.committed()
        for step, path in reversed(found):
            try:
                return step, path, self.load(path, model, optimizer)
            except (Exception, CheckpointException) as e:  # dcp's error is a BaseException
                log.error("checkpoint %s is damaged, refused (%s: %s); trying the previous one",
                          path, type(e).__name__, str(e).splitlines()[0][:300])  # fmt: skip
        if found:
            raise RuntimeError(
                f"every committed checkpoint under {self.root} is damaged "
                f"({', '.join(p.name for _s, p in found)}); move them away to start afresh, "
                "or set learner.checkpoint.resume=false"
            )
        return None

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        trainer_state: dict[str, Any],
    ) -> Path:
        """Collective: every rank writes its shards; rank 0 writes the state and the marker."""
        path = self.dir_for(step)
        rank = dist.get_rank()
        if rank == 0 and path.exists():  # a folder left by a crash mid-save
            shutil.rmtree(path)
        dist.barrier()
        state = self._state(model, optimizer)
        dcp.save(state, checkpoint_id=str(path))
        rng: dict[str, Any] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        torch.save(rng, path / f"rng_rank{rank}.pt")
        if rank == 0:
            _write_atomic(path / "trainer_state.json", json.dumps(trainer_state))
        dist.barrier()
        if rank == 0:
            _write_atomic(path / MARKER, str(step))
            self._prune()
        dist.barrier()
        return path

    def load(
        self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """Collective: restore model, optimizer and this rank's RNG; returns the trainer state."""
        state = self._state(model, optimizer)
        dcp.load(state, checkpoint_id=str(path))
        set_model_state_dict(model, state["model"], options=self.options)
        set_optimizer_state_dict(model, optimizer, state["optim"])
        rng_path = path / f"rng_rank{dist.get_rank()}.pt"
        if rng_path.exists():  # absent when the world size changed: seeds stay as they are
            rng = torch.load(rng_path, weights_only=False)
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state(rng["cuda"])
        return json.loads((path / "trainer_state.json").read_text())

    def _state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        sd = get_model_state_dict(model, options=self.options)
        return {
            "model": trainable_entries(model, sd) if self.options.ignore_frozen_params else sd,
            "optim": get_optimizer_state_dict(model, optimizer),
        }

    def _prune(self) -> None:
        found = self.committed()
        for _step, p in found[: max(0, len(found) - self.keep)]:
            shutil.rmtree(p, ignore_errors=True)
        # Folders of saves that crashed before their marker (older than the newest commit).
        newest = found[-1][0] if found else -1
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and int(m.group(1)) < newest and not (p / MARKER).exists():
                shutil.rmtree(p, ignore_errors=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)
