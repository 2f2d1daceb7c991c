"""Corrupt and partial checkpoints, through the learner's ``CheckpointManager``.

One process, a real gloo group of one rank, a small model and AdamW; checkpoints of steps 1 and 2
are written with ``CheckpointManager.save``. A save cut short (no ``COMMITTED``) must be ignored;
a committed checkpoint whose files were damaged afterwards (disk error, a half-copied run folder)
should be refused with a clear error and the previous one used.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from learner.checkpoint import MARKER, CheckpointManager

pytestmark = pytest.mark.usefixtures("one_rank")


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


@pytest.fixture
def two_checkpoints(tmp_path: Path) -> tuple[CheckpointManager, dict[int, dict[str, torch.Tensor]]]:
    """Checkpoints of steps 1 and 2; returns the manager and each step's weights."""
    mgr = CheckpointManager(tmp_path / "checkpoints", keep=3)
    model, opt = _model()
    weights = {}
    for step in (1, 2):
        _train_step(model, opt)
        mgr.save(step, model, opt, {"step": step, "weight_version": step})
        weights[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return mgr, weights


def _resume(mgr: CheckpointManager) -> tuple[dict, nn.Module]:
    """What ``Trainer.resume`` does with the manager: the newest committed checkpoint that loads."""
    model, opt = _model()
    loaded = mgr.load_latest(model, opt)
    assert loaded is not None
    return loaded[2], model


def _same(model: nn.Module, weights: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_a_save_cut_short_is_ignored(two_checkpoints) -> None:
    mgr, weights = two_checkpoints
    partial = mgr.dir_for(3)
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half a shard")
    (partial / "trainer_state.json").write_text('{"step": 3')
    assert mgr.latest() == (2, mgr.dir_for(2))
    state, model = _resume(mgr)
    assert state["step"] == 2 and _same(model, weights[2])


def _corrupt_shard(path: Path) -> None:
    shard = next(p for p in path.iterdir() if p.suffix == ".distcp")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])


def _corrupt_state(path: Path) -> None:
    (path / "trainer_state.json").write_text("{not json")


def _remove_metadata(path: Path) -> None:
    (path / ".metadata").unlink()


CORRUPTIONS = {"truncated-shard": _corrupt_shard, "bad-state-json": _corrupt_state,
               "no-metadata": _remove_metadata}  # fmt: skip


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_damaged_checkpoint_is_refused_and_the_previous_one_used(
    two_checkpoints, corrupt, caplog
) -> None:
    mgr, weights = two_checkpoints
    corrupt(mgr.dir_for(2))
    assert (mgr.dir_for(2) / MARKER).exists()
    state, model = _resume(mgr)
    assert state["step"] == 1 and _same(model, weights[1])
    assert "step_000002 is damaged, refused" in caplog.text


def test_when_every_checkpoint_is_damaged_the_learner_stops_with_a_clear_error(
    two_checkpoints,
) -> None:
    mgr, _weights = two_checkpoints
    for step in (1, 2):
        _corrupt_state(mgr.dir_for(step))
    with pytest.raises(RuntimeError, match=r"every committed checkpoint .* is damaged"):
        _resume(mgr)
