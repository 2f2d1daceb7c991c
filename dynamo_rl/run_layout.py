"""Where models and sub-runs live in a run folder: one place for the paths that ``dynamo-rl up``
writes, that ``dynamo-rl sft`` defaults to and that the dashboard and the console read.

- ``<run.dir>/model/init``: the fresh tiny model ``up`` builds when no model is given;
- ``<run.dir>/model/sft``: that model after ``up``'s supervised warm start (RL starts here);
- ``<run.dir>/model/sft_control``: the SFT-continuation control's model (``up.sft_control``);
- ``<out>.run``: the run folder of the ``sft`` call that writes ``<out>`` (its step log,
  ``metrics.jsonl``, and its warnings), unless ``run.dir`` says otherwise.
"""

from __future__ import annotations

from pathlib import Path


def init_model(run_dir: Path) -> Path:
    """The fresh tiny model ``up`` builds (``<run.dir>/model/init``)."""
    return run_dir / "model" / "init"


def warm_start_model(run_dir: Path) -> Path:
    """The warm-started model RL starts from (``<run.dir>/model/sft``)."""
    return run_dir / "model" / "sft"


def sft_run_dir(out: Path) -> Path:
    """The run folder of the ``sft`` call that writes the model folder ``out`` (``<out>.run``)."""
    return out.with_name(out.name + ".run")


def sft_control_model(run_dir: Path) -> Path:
    """The SFT-continuation control's model (``<run.dir>/model/sft_control``)."""
    return run_dir / "model" / "sft_control"
