"""``learner.trackers``: TensorBoard event files and wandb offline runs in the run folder, read back
with tensorboard's EventAccumulator and wandb's own record protobufs (the offline ``.wandb`` file is
wandb's documented transaction log: a ``:W&B`` header, then LevelDB-log-style 32 KiB blocks of
checksummed chunks, each record a ``wandb_internal_pb2.Record``)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from dynamo_rl.config import ExperimentConfig, load_config
from dynamo_rl.trackers import Trackers, eval_metrics, missing_packages
from learner.steplog import StepLog

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    """Every record of an offline ``run-<id>.wandb`` file, as wandb's protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a wandb transaction log"
    out, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FIRST:
            pending = chunk
            continue
        if kind == MIDDLE:
            pending += chunk
            continue
        raw = pending + chunk if kind == LAST else chunk
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def wandb_run(run_dir: Path) -> tuple[dict[str, Any], dict[int, dict[str, float]]]:
    """(config, {step: {key: value}}) of every offline wandb run under ``run_dir/wandb``."""
    config: dict[str, Any] = {}
    history: dict[int, dict[str, float]] = {}
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, f"no offline wandb run under {run_dir / 'wandb'}"
    for path in files:
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                for item in record.run.config.update:
                    config[item.key] = json.loads(item.value_json)
            elif kind == "history":
                row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                       for i in record.history.item}  # fmt: skip
                step = int(row.pop("_step"))
                history.setdefault(step, {}).update(
                    {k: v for k, v in row.items() if not k.startswith("_")}
                )
    return config, history


def tensorboard_scalars(run_dir: Path) -> tuple[dict[str, dict[int, float]], str]:
    """({tag: {step: value}}, the config text) of ``run_dir/tensorboard``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    texts = (
        acc.Tensors("config/text_summary") if "config/text_summary" in acc.Tags()["tensors"] else []
    )
    config = texts[0].tensor_proto.string_val[0].decode() if texts else ""
    return scalars, config


def test_step_records_and_evaluations_reach_both_trackers(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    cfg = ExperimentConfig()
    config = {"run": {"name": "t"}, "learner": {"lr": 2e-4}}
    trackers = Trackers(["tensorboard", "wandb"], tmp_path, "t", config, cfg.learner.wandb)
    log = StepLog(tmp_path / "metrics.jsonl", trackers)
    for step in (1, 2, 3):
        log.write({"step": step, "loss": 1.0 / step, "reward_mean": 0.1 * step, "push_ok": True,
                   "note": "text"})  # fmt: skip
    log.close()
    # up's evaluations, logged afterwards by another process-run resuming the same wandb run.
    before = {"accuracy": 0.25, "by_data_source": {"arith-easy": {"accuracy": 0.5}},
              "by_tier": {"hard": {"accuracy": 0.125}}}  # fmt: skip
    after = {"accuracy": 0.5, "by_data_source": {"arith-easy": {"accuracy": 0.75}},
             "by_tier": {"hard": {"accuracy": 0.375}}}  # fmt: skip
    evals = Trackers(["tensorboard", "wandb"], tmp_path, "t", config, cfg.learner.wandb)
    evals.log(eval_metrics("before", before) | eval_metrics("after", after), 3)
    evals.close()

    w_config, history = wandb_run(tmp_path)
    assert w_config["learner"] == {"lr": 2e-4}
    assert {s: history[s]["loss"] for s in (1, 2, 3)} == {1: 1.0, 2: 0.5, 3: pytest.approx(1 / 3)}
    assert history[2]["reward_mean"] == pytest.approx(0.2)
    assert "push_ok" not in history[1] and "note" not in history[1]  # only numbers are logged
    assert history[3]["eval/after/accuracy"] == 0.5
    assert history[3]["eval/before/arith-easy/accuracy"] == 0.5
    # One run: the evaluations resumed the learner's run id.
    # (From the transaction logs' names, run-<id>.wandb: a second folder opened within the same
    # second gets a "-1" suffix after the id.)
    ids = {p.stem.split("-", 1)[1] for p in (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")}
    assert ids == {(tmp_path / "wandb" / "run_id").read_text().strip()}

    scalars, tb_config = tensorboard_scalars(tmp_path)
    assert scalars["loss"] == {1: 1.0, 2: 0.5, 3: pytest.approx(1 / 3)}
    assert scalars["eval/after/arith-easy/accuracy"] == {3: 0.75}
    assert scalars["eval/after/tier/hard/accuracy"] == {3: 0.375}
    assert "push_ok" not in scalars
    assert "lr: 0.0002" in tb_config


def test_eval_breakdown_has_each_source_and_tier_of_each_benchmark() -> None:
    from dynamo_rl.trackers import eval_breakdown

    one = {"accuracy": 0.5, "by_data_source": {"arith": {"accuracy": 0.5}},
           "by_tier": {"easy": {"accuracy": 0.75}, "hard": {"accuracy": 0.25}}}  # fmt: skip
    assert eval_breakdown(one) == {"arith": 0.5, "tier/easy": 0.75, "tier/hard": 0.25}
    two = {"accuracy": 0.5, "benchmarks": {"a": one, "b": {"accuracy": 0.0, "by_tier": {}}}}
    assert eval_breakdown(two) == {
        "a": 0.5, "a/arith": 0.5, "a/tier/easy": 0.75, "a/tier/hard": 0.25, "b": 0.0,
    }  # fmt: skip


def test_trackers_field_accepts_a_list_or_comma_separated_text() -> None:
    cfg = load_config(None, ["learner.trackers=tensorboard,wandb"])
    assert cfg.learner.trackers == ["tensorboard", "wandb"]
    with pytest.raises(ValueError, match=r"learner\.trackers"):
        load_config(None, ["learner.trackers=[mlflow]"])


def test_missing_tracker_package_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    # wandb "not installed": what a machine without the trackers extra answers.
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))  # fmt: skip
    error = missing_packages(["wandb"])
    assert error is not None and "learner.trackers" in error and "wandb" in error
    assert missing_packages([]) is None
