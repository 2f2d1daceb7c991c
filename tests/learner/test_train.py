"""The learner end to end under a real torchrun (gloo, CPU) on a tiny model, fed by a real Redis
stream written with the real codec."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
import redis

from dynamo_rl import keys
from learner.steplog import read_log
from learner.tiny_model import build_tiny_model
from tests.learner.helpers import (
    FIXED_LAYOUT,
    FIXED_SIZES,
    RECIPE,
    assert_same_training,
    base_overrides,
    make_groups,
    run_learner,
    start_learner,
    write_groups,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "m", hidden_size=32, num_layers=2)


def test_two_ranks_match_one_rank_and_the_loss_falls(
    tiny_model: Path, redis_url: str, tmp_path: Path
) -> None:
    fixed = make_groups(4, sizes=FIXED_SIZES)  # the same batch every step (helpers.FIXED_SIZES)
    layout = FIXED_LAYOUT
    records = {}
    for nproc in (2, 1):
        name = f"fixed{nproc}"
        client = redis.Redis.from_url(redis_url)
        client.xadd(keys.trajectory_stream(name), {b"v": b"1", b"g": b"poison"})
        write_groups(redis_url, name, fixed * 4)
        overrides = base_overrides(tiny_model, tmp_path / name, redis_url, name)
        run_learner(
            nproc, [*overrides, *RECIPE, *layout, "learner.max_steps=4"], tmp_path / f"{name}.log"
        )
        records[nproc] = read_log(tmp_path / name / "metrics.jsonl")
        assert [r["step"] for r in records[nproc]] == [1, 2, 3, 4]
        # The poison entry went to the dead-letter stream; everything trained was acknowledged.
        dead = client.xrange(keys.dead_letter_stream(name))
        assert len(dead) == 1 and b"protobuf" in dead[0][1][b"reason"]
        assert (
            client.xpending(keys.trajectory_stream(name), keys.learner_group(name))["pending"] == 0
        )
        client.close()
    two = records[2]
    assert_same_training(two, records[1])
    losses = [r["loss"] for r in two]
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(r["responses"] == 13 and r["groups"] == 4 for r in two)
    assert all(len(r["update_losses"]) == 4 for r in two)  # 2 epochs x 2 mini-batches
    # The export is a loadable Hugging Face model.
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "fixed2" / "export" / "final")

    # Resharding: both runs continue for one step on ONE rank from their step-4 checkpoints (the
    # 2-rank one is read back into a 1-rank layout by torch.distributed.checkpoint).
    fifth = {}
    for nproc in (2, 1):
        name = f"fixed{nproc}"
        write_groups(redis_url, name, fixed)
        overrides = base_overrides(tiny_model, tmp_path / name, redis_url, name)
        run_learner(1, [*overrides, *RECIPE, *layout, "learner.max_steps=5"], tmp_path / "more.log")
        log = read_log(tmp_path / name / "metrics.jsonl")
        assert [r["step"] for r in log] == [1, 2, 3, 4, 5]  # resumed at 4, one more step
        fifth[nproc] = log[-1]
    assert fifth[2]["loss"] == pytest.approx(fifth[1]["loss"], abs=1e-4)
    assert fifth[2]["grad_norm"] == pytest.approx(fifth[1]["grad_norm"], abs=1e-4)


def _descendants(pid: int) -> list[int]:
    """Child processes, recursively (torchrun starts its workers in their own sessions)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            out += [child, *_descendants(child)]
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead rank may wait a moment to be reaped by its new parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_launcher(proc) -> list[int]:
    """SIGKILL torchrun only; the ranks (in their own sessions) must die with it. Returns the
    ranks still alive after 20 s (and then kills them, so nothing is left behind)."""
    ranks = _descendants(proc.pid)
    proc.signal(signal.SIGKILL)
    proc.stop(grace=5)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(map(_running, ranks)):
        time.sleep(0.1)
    alive = [p for p in ranks if _running(p)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return alive


def _wait_for_step(log_path: Path, step: int, proc, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in read_log(log_path)):
            return
        if not proc.alive():
            raise AssertionError(f"learner died:\n{proc.log_tail(60)}")
        time.sleep(0.2)
    raise AssertionError(f"no step {step} in time:\n{proc.log_tail(60)}")


def test_kill_after_checkpoint_resumes_to_the_same_loss(
    tiny_model: Path, redis_url: str, tmp_path: Path
) -> None:
    batches = [make_groups(4, seed=s) for s in range(4)]  # a different batch every step
    common = [*RECIPE, "learner.max_steps=4", "learner.stream.wait_timeout_s=120"]

    # Uninterrupted reference run.
    write_groups(redis_url, "whole", [g for b in batches for g in b])
    run_learner(2, [*base_overrides(tiny_model, tmp_path / "whole", redis_url, "whole"), *common],
                tmp_path / "whole.log")  # fmt: skip
    whole = {r["step"]: r for r in read_log(tmp_path / "whole" / "metrics.jsonl")}

    # Same data, but only three batches exist yet: the learner checkpoints at step 2, trains step
    # 3 (not checkpointed) and waits for a fourth batch — then it is killed.
    overrides = [*base_overrides(tiny_model, tmp_path / "cut", redis_url, "cut"), *common]
    write_groups(redis_url, "cut", [g for b in batches[:3] for g in b])
    proc = start_learner(2, overrides, tmp_path / "cut.log")
    try:
        _wait_for_step(tmp_path / "cut" / "metrics.jsonl", 3, proc)
    finally:
        orphans = _kill_launcher(proc)
    assert orphans == []  # every rank went down with the launcher
    client = redis.Redis.from_url(redis_url)
    stream, group = keys.trajectory_stream("cut"), keys.learner_group("cut")
    assert client.xpending(stream, group)["pending"] == 4  # step 3's groups, never acknowledged

    write_groups(redis_url, "cut", batches[3])
    run_learner(2, overrides, tmp_path / "cut2.log")
    cut = read_log(tmp_path / "cut" / "metrics.jsonl")
    assert [r["step"] for r in cut] == [1, 2, 3, 3, 4]  # step 3 again after the restart
    for before, after in ((cut[2], whole[3]), (cut[3], whole[3]), (cut[4], whole[4])):
        assert before["loss"] == pytest.approx(after["loss"], abs=1e-6)
        assert before["grad_norm"] == pytest.approx(after["grad_norm"], abs=1e-6)
    assert client.xpending(stream, group)["pending"] == 0
    client.close()
