"""The reward-model worker process over its pipes: hello, batches, bad requests, bad models."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.services.reward.test_composite import build_reward_model

PAIRS = [["1+1=", "2"], ["Name a colour.", "A long answer about blue and green."], ["x", "y"]]


def start(path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.reward_model.worker", "--path", str(path), *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO,
    )  # fmt: skip


def ask(proc: subprocess.Popen[str], request: dict) -> dict:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(request) + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_reward_model(tmp_path_factory.mktemp("rm") / "rm")


@pytest.fixture(scope="module")
def singles(rm_dir: Path) -> list[float]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rm_dir)
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    with torch.inference_mode():
        return [float(model(input_ids=torch.tensor([tok.encode(p + r)])).logits[0, 0])
                for p, r in PAIRS]  # fmt: skip


def worker(rm_dir: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    proc = start(rm_dir, *args)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def cpu_worker(rm_dir: Path) -> Iterator[subprocess.Popen[str]]:
    yield from worker(rm_dir)


def test_batches_score_like_single_pairs_and_bad_requests_keep_it_alive(
    cpu_worker: subprocess.Popen[str], singles: list[float]
) -> None:
    assert cpu_worker.stdout is not None
    assert json.loads(cpu_worker.stdout.readline()) == {
        "ready": True, "device": "cpu", "dtype": "float32"
    }  # fmt: skip
    assert ask(cpu_worker, {"pairs": PAIRS})["scores"] == pytest.approx(singles, abs=1e-4)
    assert "error" in ask(cpu_worker, {"pairs": [["only a prompt"]]})
    assert "error" in ask(cpu_worker, {"nope": 1})
    assert ask(cpu_worker, {"pairs": []}) == {"scores": []}
    assert ask(cpu_worker, {"pairs": PAIRS[:1]})["scores"] == pytest.approx(singles[:1], abs=1e-4)


def test_a_directory_without_a_reward_model_is_refused(tmp_path: Path) -> None:
    proc = start(tmp_path)
    out, _err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "error" in json.loads(out.splitlines()[0])


@pytest.mark.gpu
def test_cuda_scores_match_cpu(rm_dir: Path, singles: list[float]) -> None:
    for proc in worker(rm_dir, "--device", "cuda"):
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["ready"] is True
        assert ask(proc, {"pairs": PAIRS})["scores"] == pytest.approx(singles, abs=1e-3)
