"""On-policy distillation's teacher stage (``services/rollout/teacher.py``) against real embedded
engines: a teacher that is down when the batch is scored is retried with back-off until it comes
up, and every response gets the log-probs of a fresh forward pass of the teacher; a teacher
whose tokenizer is not the student's is refused at start, naming both."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import torch

from dynamo_rl.codec import Response, TrajectoryGroup
from dynamo_rl.config import load_config
from dynamo_rl.config.rollout import TeacherConfig
from dynamo_rl.procs import free_port
from dynamo_rl.service_table import SERVICES
from learner.tiny_model import build_char_tokenizer, build_tiny_model
from services.rollout.engines import EngineUnavailable
from services.rollout.metrics import WorkerMetrics
from services.rollout.teacher import TeacherStage, build_teacher, check_tokenizers
from tests.conftest import REPO
from tests.services.engine.engine_util import load_reference, reference_logprobs


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("teacher") / "m", seed=7)


def groups() -> list[TrajectoryGroup]:
    return [
        TrajectoryGroup(
            prompt_id="a", prompt_token_ids=[10, 20, 30],
            responses=[
                Response(token_ids=[5, 6, 7], logprobs=[-1.0] * 3),
                Response(token_ids=[40], logprobs=[-1.0]),
                # A forked sample with its own prompt (multi-turn): scored after that prompt.
                Response(token_ids=[8, 9], logprobs=[-1.0] * 2, prompt_token_ids=[10, 11]),
            ],
        ),
        TrajectoryGroup(
            prompt_id="b", prompt_token_ids=[50, 60],
            responses=[Response(token_ids=[70, 80, 90, 100], logprobs=[-1.0] * 4)],
        ),
    ]  # fmt: skip


def test_a_teacher_outage_is_waited_out_and_nothing_is_lost(
    teacher_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    cfg = TeacherConfig(engine_urls=[f"http://127.0.0.1:{port}"], tokenizer=str(teacher_dir))
    retries: list[str] = []
    stage = TeacherStage(
        cfg, backoff_s=0.2, backoff_max_s=1.0, on_retry=lambda r, _d: retries.append(r)
    )
    batch = groups()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DYNAMO_CONTROL_TOKEN", None)
    procs = []

    async def run() -> None:
        scoring = asyncio.create_task(stage.score(batch))
        while len(retries) < 2:  # the teacher is down: its requests are being retried
            await asyncio.sleep(0.05)
        assert not scoring.done()
        proc, _ = await asyncio.to_thread(
            SERVICES["engine"].start, tmp_path / "teacher.log", "--model", str(teacher_dir),
            "engine.register_in_redis=false", port=port, env=env, cwd=REPO, timeout=120,
        )  # fmt: skip
        procs.append(proc)
        await asyncio.wait_for(scoring, 120)
        await stage.aclose()

    try:
        asyncio.run(run())
    finally:
        for p in procs:
            p.stop()
    assert all("EngineUnavailable" in r for r in retries)
    reference = load_reference(teacher_dir)
    for g in batch:
        for r in g.responses:
            prompt = list(r.prompt_token_ids or g.prompt_token_ids)
            want = reference_logprobs(reference, prompt, list(r.token_ids))
            assert len(r.teacher_logprobs) == len(r.token_ids)
            torch.testing.assert_close(
                torch.tensor(list(r.teacher_logprobs)), want, atol=1e-3, rtol=0
            )


def test_a_teacher_with_another_tokenizer_is_refused(teacher_dir: Path, tmp_path: Path) -> None:
    student = build_tiny_model(tmp_path / "student", seed=1)
    check_tokenizers(student, teacher_dir)  # built alike: one tokenizer, accepted
    other = build_char_tokenizer()
    other.add_special_tokens({"additional_special_tokens": ["<|teacher|>"]})
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError) as refused:
        check_tokenizers(student, tmp_path / "other")
    message = str(refused.value)
    assert message.startswith("rollout.teacher.tokenizer: the teacher's tokenizer")
    assert f"({tmp_path / 'other'})" in message and f"({student})" in message
    assert f"{len(other) - 1} tokens against {len(other)}" in message


def test_a_teacher_down_past_max_wait_fails_the_batch_unscored(teacher_dir: Path) -> None:
    cfg = TeacherConfig(
        engine_urls=[f"http://127.0.0.1:{free_port()}"], tokenizer=str(teacher_dir), max_wait_s=0.6
    )
    stage = TeacherStage(cfg, backoff_s=0.1, backoff_max_s=0.2)
    batch = groups()

    async def run() -> None:
        try:
            await stage.score(batch)
        finally:
            await stage.aclose()

    with pytest.raises(EngineUnavailable):
        asyncio.run(run())
    assert not any(r.teacher_logprobs for g in batch for r in g.responses)


def test_the_worker_builds_its_teacher_after_the_tokenizer_check(
    teacher_dir: Path, tmp_path: Path
) -> None:
    other = build_char_tokenizer()
    other.add_special_tokens({"additional_special_tokens": ["<|teacher|>"]})
    other.save_pretrained(tmp_path / "other")

    def config(tokenizer: Path):
        return load_config(
            None, ["rollout.teacher.engine_urls=[http://127.0.0.1:1]",
                   f"rollout.teacher.tokenizer={tokenizer}"], env={},
        )  # fmt: skip

    assert build_teacher(load_config(None, [], env={}), teacher_dir, WorkerMetrics()) is None
    stage = build_teacher(config(teacher_dir), teacher_dir, WorkerMetrics())
    assert isinstance(stage, TeacherStage) and len(stage.engines) == 1
    with pytest.raises(ValueError, match=r"rollout\.teacher\.tokenizer: the teacher's tokenizer"):
        build_teacher(config(tmp_path / "other"), teacher_dir, WorkerMetrics())
