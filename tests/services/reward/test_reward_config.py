"""Reward specs in the experiment config: mistakes stop start-up with the key named."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dynamo_rl.config import ConfigError, load_config
from tests.conftest import REPO, dynamo_rl_argv

MODEL = "reward.models.rm.path=/models/rm"
JUDGE = "reward.judges.j.url=http://127.0.0.1:1"


def load(*overrides: str):
    return load_config(None, list(overrides), env={})


def error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        load(*overrides)
    return str(e.value)


def test_a_valid_spec_loads() -> None:
    cfg = load(
        MODEL, JUDGE,
        "reward.composite.gsm.components=[{kind: math}, {kind: model, weight: 0.5, gate: math},"
        " {kind: judge, name: style}, {kind: length, max_length: 512, buffer: 64},"
        " {kind: format}]",
    )  # fmt: skip
    spec = cfg.reward.composite["gsm"]
    assert [c.label for c in spec.components] == ["math", "model", "style", "length", "format"]
    assert spec.verifier() == "math"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["reward.composite.x.components=[{kind: vibes}]"], "reward.composite.x.components.0"),
        (["reward.composite.x.components=[{kind: math, weight: heavy}]"],
         "reward.composite.x.components.0.math.weight: Input should be a valid number"),
        (["reward.models.rm.device=cpu"], "reward.models.rm.path: Field required"),
        (["reward.composite.x.components=[{kind: model}]"],
         "reward.composite.x.components.0.model: required when reward.models has 0 entries"),
        ([MODEL, "reward.composite.x.components=[{kind: model, model: big}]"],
         "reward.composite.x.components.0.model: 'big' is not in reward.models"),
        (["reward.composite.x.components=[{kind: judge}]"],
         "reward.composite.x.components.0.judge: required"),
        (["reward.composite.x.components=[{kind: math}, {kind: format, gate: maths}]"],
         "reward.composite.x.components.1.gate: 'maths' is not an ungated component"),
        (["reward.composite.x.components=[{kind: math}, {kind: math}]"],
         "reward.composite.x.components.1: component name 'math' is used twice"),
        (["reward.composite.x.components=[{kind: format}]"],
         "reward.composite.x.components.0.pattern: required when the spec has no math/code"),
        (["reward.composite.x.components=[{kind: format, pattern: '('}]"],
         "reward.composite.x.components.0.format.pattern"),
        (["reward.composite.x.components=[{kind: math}]", "reward.composite.x.correct_from=rm"],
         "reward.composite.x.correct_from: 'rm' is not an ungated component"),
        (["reward.composite.x.components=[]"], "reward.composite.x.components"),
        (["reward.code.enabled=false", "reward.composite.x.components=[{kind: code}]"],
         "reward.composite.x.components.0: a code component needs reward.code.enabled=true"),
        ([JUDGE, "reward.judges.j.score_pattern=score"], "reward.judges.j.score_pattern"),
        ([JUDGE, "reward.judges.j.template='{question}'"], "reward.judges.j.template"),
        ([JUDGE, "reward.judges.j.retry_backoff_s=20"],
         "retry_backoff_s (20.0) must be <= retry_backoff_max_s (10.0)"),
    ],
)  # fmt: skip
def test_mistakes_name_the_key(overrides: list[str], expected: str) -> None:
    assert expected in error(*overrides)


def test_start_up_refuses_a_missing_model_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    out = subprocess.run(
        dynamo_rl_argv("reward", "--port", "0", "reward.code.enabled=false",
                       f"reward.models.rm.path={missing}"),
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1
    assert f"reward.models.rm.path: '{missing}' is not a directory" in out.stderr


def test_start_up_refuses_a_directory_without_a_reward_model(tmp_path: Path) -> None:
    out = subprocess.run(
        dynamo_rl_argv("reward", "--port", "0", "reward.code.enabled=false",
                       f"reward.models.rm.path={tmp_path}"),
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode != 0
    assert f"reward.models.rm.path: cannot load a reward model from '{tmp_path}'" in out.stderr
