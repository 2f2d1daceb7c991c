"""Experiment trackers (``learner.trackers``): TensorBoard and Weights & Biases.

The learner feeds every step record to :class:`Trackers` (its JSONL step log stays the source of
truth); ``up`` feeds the held-out evaluations before and after RL to the same run after training.
Both write into the run folder:

- ``tensorboard``: event files in ``<run.dir>/tensorboard`` (one scalar per numeric key, the step
  as x; the run config as the text ``config``). Needs the ``tensorboard`` package.
- ``wandb``: one run in ``<run.dir>/wandb`` whose id is kept in ``<run.dir>/wandb/run_id`` so that
  a restarted learner and ``up``'s evaluations resume the same run; ``learner.wandb.mode`` offline
  (the default) needs no network and no account (``wandb sync <run.dir>/wandb/offline-run-*``
  uploads it later). Needs the ``wandb`` package.

``pip install 'dynamo-rl[trackers]'`` installs both.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["TrackerError", "Trackers", "eval_breakdown", "eval_metrics", "missing_packages"]

KINDS = ("tensorboard", "wandb")


class TrackerError(RuntimeError):
    """A tracker asked for in ``learner.trackers`` cannot start (its package is missing)."""


def _numeric(record: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if key != "step" and math.isfinite(value):
            out[key] = float(value)
    return out


def eval_breakdown(result: Mapping[str, Any]) -> dict[str, float]:
    """Accuracy per part of an ``eval_<label>.json`` (``dynamo-rl eval``'s output): per data
    source, per difficulty tier (``tier/<name>``, from ``by_tier``: the ``arith`` task's tiers), and
    per benchmark when it ran several (``<benchmark>``, ``<benchmark>/<source>``,
    ``<benchmark>/tier/<name>``)."""
    benchmarks = result.get("benchmarks") or {"": result}
    out: dict[str, float] = {}
    for name, part in benchmarks.items():
        prefix = f"{name}/" if len(benchmarks) > 1 else ""
        if prefix:
            out[name] = float(part["accuracy"])
        for source, figures in (part.get("by_data_source") or {}).items():
            out[prefix + source] = float(figures["accuracy"])
        for tier, figures in (part.get("by_tier") or {}).items():
            out[f"{prefix}tier/{tier}"] = float(figures["accuracy"])
    return out


def eval_metrics(label: str, result: Mapping[str, Any]) -> dict[str, float]:
    """An ``eval_<label>.json`` as tracker scalars: ``eval/<label>/accuracy`` and
    ``eval/<label>/<part>/accuracy`` for each part of :func:`eval_breakdown`."""
    out = {f"eval/{label}/accuracy": float(result["accuracy"])}
    for part, accuracy in eval_breakdown(result).items():
        out[f"eval/{label}/{part}/accuracy"] = accuracy
    return out


def missing_packages(kinds: Sequence[str]) -> str | None:
    """An error naming ``learner.trackers`` if a tracker's package is not installed, else None
    (checked by ``up`` and the learner before anything starts)."""
    import importlib.util

    missing = [k for k in dict.fromkeys(kinds) if importlib.util.find_spec(k) is None]
    if not missing:
        return None
    return (
        f"learner.trackers: {', '.join(missing)} requested but not installed "
        "(pip install 'dynamo-rl[trackers]', or remove it from learner.trackers; allowed: "
        f"{', '.join(KINDS)})"
    )


class _TensorBoard:
    """TensorBoard event files with tensorboard's own writer and protobufs (no torch: this module
    is shared by ``up``, which imports no torch): scalars as ``simple_value`` summaries and text
    through the text plugin, as ``torch.utils.tensorboard.SummaryWriter`` writes them."""

    def __init__(self, folder: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        folder.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(folder))

    def _emit(self, value: Any, step: int) -> None:
        import time

        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._writer.add_event(
            Event(wall_time=time.time(), step=step, summary=Summary(value=[value]))
        )

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._emit(Summary.Value(tag=tag, simple_value=value), step)

    def add_text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

        metadata = SummaryMetadata(
            plugin_data=SummaryMetadata.PluginData(
                plugin_name="text", content=TextPluginData(version=0).SerializeToString()
            )
        )
        tensor = TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode()],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        self._emit(Summary.Value(tag=f"{tag}/text_summary", metadata=metadata, tensor=tensor), step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class Trackers:
    """The trackers named in ``kinds``, opened for the run in ``run_dir``."""

    def __init__(
        self,
        kinds: Sequence[str],
        run_dir: str | Path,
        run_name: str,
        config: Mapping[str, Any],
        wandb: Any = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self._tb: Any = None
        self._wandb: Any = None
        for kind in kinds:
            if kind not in KINDS:
                raise TrackerError(f"learner.trackers: unknown tracker {kind!r} (allowed: {KINDS})")
        if "tensorboard" in kinds:
            self._tb = self._open_tensorboard(config)
        if "wandb" in kinds:
            self._wandb = self._open_wandb(run_name, config, wandb)

    def _open_tensorboard(self, config: Mapping[str, Any]) -> Any:
        try:
            writer = _TensorBoard(self.run_dir / "tensorboard")
        except ImportError as e:
            raise TrackerError(
                "learner.trackers: tensorboard needs the tensorboard package "
                "(pip install 'dynamo-rl[trackers]')"
            ) from e
        import yaml

        text = yaml.safe_dump(dict(config), sort_keys=False)
        writer.add_text("config", "```\n" + text + "\n```", 0)
        return writer

    def _open_wandb(self, run_name: str, config: Mapping[str, Any], settings: Any) -> Any:
        try:
            import wandb
        except ImportError as e:
            raise TrackerError(
                "learner.trackers: wandb needs the wandb package (pip install 'dynamo-rl[trackers]')"
            ) from e
        folder = self.run_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "run_id"
        if not id_file.exists():
            id_file.write_text(secrets.token_hex(4) + "\n")
        run_id = id_file.read_text().strip()
        return wandb.init(
            project=getattr(settings, "project", "dynamo-rl"),
            entity=getattr(settings, "entity", None),
            mode=getattr(settings, "mode", "offline"),
            name=run_name,
            id=run_id,
            resume="allow",
            dir=str(self.run_dir),
            config=dict(config),
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log(self, record: Mapping[str, Any], step: int) -> None:
        """Every numeric field of ``record`` (bools and ``step`` left out) at ``step``."""
        values = _numeric(record)
        if self._tb is not None:
            for key, value in values.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None and values:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            import wandb

            self._wandb.finish()
            # finish() returns before wandb's service has written everything; teardown waits
            # for it to exit, so the offline run is complete on disk when close() returns.
            wandb.teardown()
            self._wandb = None
