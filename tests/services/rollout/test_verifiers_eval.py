"""``dynamo-rl eval`` and ``dynamo-rl rollout --check-data`` with ``rollout.env.name: verifiers``:
a real embedded engine (no reward service: its URL is never reachable, so a verify call would
fail the run); the environments of ``vf_envs/`` and the repository's recipe environment
(``tasks/vf_envs/two_step_arith.py``), each in the library's own API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.rollout import cli as rollout_cli
from services.rollout import eval_cli
from tests.services.rollout.test_verifiers_env import MULTI, SINGLE
from tests.services.rollout.test_worker_verifiers import UNREACHABLE

RECIPE = str(Path(__file__).resolve().parents[3] / "tasks" / "vf_envs" / "two_step_arith.py")


def overrides(model: Path, module: str, *extra: str, engine: str = UNREACHABLE) -> list[str]:
    return [
        f"endpoints.engine_urls=[{engine}]",
        f"endpoints.reward_url={UNREACHABLE}",
        f"rollout.tokenizer={model}",
        "rollout.env.name=verifiers",
        f"rollout.env.verifiers.module={module}",
        "rollout.sampling.max_tokens=4",
        "run.seed=3",
        *extra,
    ]


def run_eval(tmp_path: Path, argv: list[str]) -> tuple[int, dict, list[dict]]:
    out, samples = tmp_path / "eval.json", tmp_path / "samples.jsonl"
    rc = eval_cli.main([*argv, "--out", str(out), "--samples", str(samples), "--bootstrap", "0"])
    if rc != 0:
        return rc, {}, []
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    return rc, json.loads(out.read_text()), rows


def test_eval_plays_the_env_eval_dataset_k_times_scored_by_its_rubric(
    chat_engine: str, chat_model: Path, tmp_path: Path
) -> None:
    argv = overrides(chat_model, SINGLE, "rollout.env.verifiers.args={n: 2, eval_n: 3}",
                     engine=chat_engine)  # fmt: skip
    rc, result, samples = run_eval(tmp_path, [*argv, "--n", "2", "--k", "1,2", "--data", "eval"])
    assert rc == 0
    bench = result["benchmarks"]["eval"]
    # The eval_dataset's 3 rows (not the 2 training rows), each sampled twice.
    assert bench["prompts"] == 3 and result["prompts"] == 3 and bench["n"] == 2
    assert bench["data"] == f"rollout.env.verifiers {SINGLE} (eval)"
    assert "What is 0+2?" in bench["example_prompt"]  # the eval rows' questions, rendered
    assert len(samples) == 6
    assert {s["prompt_id"] for s in samples} == {"vf_single-0", "vf_single-1", "vf_single-2"}
    # The rubric's reward: the length of the text the engine answered with.
    for s in samples:
        assert s["reward"] == float(len(s["text"]))
        assert s["correct"] == (s["reward"] > 0)
    correct = [[s["correct"] for s in samples if s["prompt_id"] == p] for p in
               sorted({s["prompt_id"] for s in samples})]  # fmt: skip
    assert bench["accuracy"] == pytest.approx(sum(sum(g) / 2 for g in correct) / 3)
    assert bench["pass@2"] == pytest.approx(sum(any(g) for g in correct) / 3)
    assert bench["reward_mean"] == pytest.approx(sum(s["reward"] for s in samples) / 6)
    assert bench["metrics"]["avg@2"]["mean"] == pytest.approx(bench["accuracy"])
    assert bench["metrics"]["pass@2"]["mean"] == pytest.approx(bench["pass@2"])
    assert bench["episodes"]["episodes"] == 6 and bench["episodes"]["turns_mean"] == 1.0


def test_eval_of_the_multi_turn_recipe_env_plays_both_turns(
    chat_engine: str, chat_model: Path, tmp_path: Path
) -> None:
    argv = overrides(chat_model, RECIPE, "rollout.env.verifiers.args={train: 4, test: 2}",
                     engine=chat_engine)  # fmt: skip
    rc, result, samples = run_eval(tmp_path, [*argv, "--n", "2", "--data", "eval"])
    assert rc == 0
    bench = result["benchmarks"]["eval"]
    assert bench["prompts"] == 2 and len(samples) == 4
    episodes = bench["episodes"]
    assert episodes["dropped"] == 0 and episodes["turns_mean"] == 2.0  # two model turns each
    # Half a point per right sum: every reward is 0, 0.5 or 1.
    assert {s["reward"] for s in samples} <= {0.0, 0.5, 1.0}


def test_eval_refuses_a_missing_eval_dataset_other_names_and_lora(
    chat_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No engine is reached: each is refused before any episode is played.
    rc, _, _ = run_eval(tmp_path, [*overrides(chat_model, MULTI), "--data", "eval"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "--data eval" in err and "has no eval_dataset" in err and "--data train" in err
    with pytest.raises(SystemExit) as exit_:  # refused as a usage error, before anything starts
        run_eval(tmp_path, [*overrides(chat_model, MULTI), "--data", "test.jsonl"])
    assert exit_.value.code == 2
    assert "one of ['eval', 'train']" in capsys.readouterr().err
    rc, _, _ = run_eval(tmp_path, [*overrides(chat_model, MULTI), "learner.lora.enabled=true",
                                   "--data", "train"])  # fmt: skip
    assert rc == 1
    assert "learner.lora.enabled must be false" in capsys.readouterr().err


def test_eval_of_the_training_rows_when_named(
    chat_engine: str, chat_model: Path, tmp_path: Path
) -> None:
    argv = overrides(chat_model, SINGLE, "rollout.env.verifiers.args={n: 2}", engine=chat_engine)
    rc, result, samples = run_eval(tmp_path, [*argv, "--n", "1", "--data", "train"])
    assert rc == 0
    bench = result["benchmarks"]["train"]
    assert bench["prompts"] == 2 and len(samples) == 2
    assert "What is 0+1?" in bench["example_prompt"]  # a training row's question


def test_check_data_reads_the_env_rows_scored_by_its_rubric(
    chat_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "check.json"
    argv = overrides(chat_model, RECIPE, "rollout.env.verifiers.args={train: 5, test: 2}")
    assert rollout_cli.main([*argv, "--check-data", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["dataset"] == f"rollout.env.verifiers {RECIPE}"
    assert summary["rows"] == 5 and summary["kept"] == 5
    assert summary["sources"] == [
        {"data_source": "two_step_arith", "kind": "verifiers", "rows": 5,
         "scorer": "verifiers rubric"},
    ]  # fmt: skip
    # A module that does not load is refused, naming the setting.
    bad = overrides(chat_model, str(tmp_path / "none.py"))
    assert rollout_cli.main([*bad, "--check-data", str(out)]) == 2
