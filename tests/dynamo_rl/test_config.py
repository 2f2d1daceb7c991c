from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from dynamo_rl.config import ConfigError, ExperimentConfig, load_config
from tests.conftest import dynamo_rl_argv


def test_defaults_validate() -> None:
    cfg = load_config(env={})
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.endpoints.redis_url.startswith("redis://")


def test_yaml_then_env_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(
        "run:\n  name: exp1\nlearner:\n  lr: 3.0e-6\nendpoints:\n  reward_url: http://a\n"
    )
    env = {"REWARD_URL": "http://b:1", "ENGINE_URLS": "http://e1,http://e2"}
    cfg = load_config(path, ["learner.lr=1e-5", "run.seed=7"], env=env)
    assert cfg.run.name == "exp1"
    assert cfg.run.seed == 7
    assert cfg.learner.lr == pytest.approx(1e-5)
    assert cfg.endpoints.reward_url == "http://b:1"
    assert cfg.endpoints.engine_urls == ["http://e1", "http://e2"]
    # An explicit override beats the environment.
    cfg = load_config(path, ["endpoints.reward_url=http://c"], env=env)
    assert cfg.endpoints.reward_url == "http://c"


def test_secret_is_not_shown() -> None:
    cfg = load_config(env={"DYNAMO_CONTROL_TOKEN": "s3cret"})
    assert cfg.endpoints.control_token is not None
    assert cfg.endpoints.control_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(cfg) and "s3cret" not in str(cfg.model_dump(mode="json"))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["learner.lr=abc"], ["learner.lr", "abc", "valid number"]),
        (["learner.lr=-1"], ["learner.lr", "greater than 0"]),
        (["learner.bogus=1"], ["learner.bogus", "unknown key", "allowed", "lr"]),
        (["bogus.x=1"], ["bogus", "unknown key", "allowed", "learner"]),
        (["run.log_level=loud"], ["run.log_level", "loud", "'debug'", "'error'"]),
        (["allocator.port=70000"], ["allocator.port", "70000", "65535"]),
        (["run.name=has space"], ["run.name", "has space"]),
        (["learner.lr"], ["KEY=VALUE"]),
        (["learner..lr=1"], ["empty key"]),
        (["rollout.update_mode=sometimes"], ["rollout.update_mode", "'wait'", "'interrupt'"]),
        (
            ["rollout.update_mode=interrupt", "rollout.vllm_pause_mode=keep"],
            ["rollout.vllm_pause_mode", "'keep'", "update_mode 'interrupt'", "abort"],
        ),
        (
            ["rollout.update_mode=interrupt", "learner.lora.enabled=true"],
            ["rollout.update_mode=interrupt", "learner.lora.enabled=true"],
        ),
    ],
)
def test_bad_values_name_the_field(overrides: list[str], expected: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides, env={})
    for text in expected:
        assert text in str(info.value)


def test_update_mode_sets_the_push_pause() -> None:
    cfg = load_config(overrides=["rollout.update_mode=interrupt"], env={})
    assert cfg.rollout.push_pause_mode == "abort"
    # up writes the resolved config (every field set) and validates it again.
    again = type(cfg).model_validate(cfg.model_dump(mode="json"))
    assert again.rollout.push_pause_mode == "abort"
    rc = load_config(overrides=["rollout.vllm_pause_mode=keep"], env={}).rollout
    assert rc.update_mode == "wait" and rc.push_pause_mode == "keep"


def test_unknown_yaml_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("learner:\n  lr: 1.0e-6\n  lrr: 2\n")
    with pytest.raises(ConfigError, match=r"learner\.lrr: unknown key; allowed: .*lr"):
        load_config(path, env={})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("[1, 2", "not valid YAML"), ("- a\n- b\n", "mapping of sections")],
)
def test_malformed_yaml(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_config(path, env={})


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/exp.yaml", env={})


def test_cli_reports_config_errors_without_traceback() -> None:
    result = subprocess.run(
        dynamo_rl_argv("config", "learner.lr=abc"), capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert "learner.lr" in result.stderr and "abc" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_prints_resolved_config() -> None:
    result = subprocess.run(
        dynamo_rl_argv("config", "--json", "run.name=zz"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert '"name": "zz"' in result.stdout


def test_shipped_configs_validate() -> None:
    configs = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
    assert configs, "no configs/*.yaml found: the loop below would check nothing"
    for path in configs:
        load_config(path, env={})


# -- the allocation parameters: declared once (AllocationParams, the allocator section) -------------

REPO = Path(__file__).resolve().parents[2]
SHIPPED_ALLOCATION = {
    # (n_per_prompt, n_min, n_max) each shipped experiment runs with: what its rollout worker sent
    # with every Allocate before the parameters were declared once (then rollout.n/n_min/n_max).
    "configs/agent_code.yaml": (8, 2, 16),
    "configs/agent_text.yaml": (8, 2, 16),
    "configs/agent_tools.yaml": (8, 2, 16),
    "configs/agent_when.yaml": (8, 2, 16),
    "configs/dapo.yaml": (16, 2, 16),
    "configs/distill.yaml": (8, 2, 16),
    "configs/dynamo_grpo.yaml": (16, 8, 24),
    "configs/grpo.yaml": (8, 2, 16),
    "configs/gspo.yaml": (8, 2, 16),
    "configs/ppo.yaml": (4, 2, 16),
    "configs/quickstart.yaml": (8, 2, 16),
    "configs/quickstart_lora.yaml": (8, 2, 16),
    "configs/quickstart_vllm.yaml": (8, 2, 16),
    "configs/verifiers_multi_turn.yaml": (8, 2, 16),
    "deploy/compose/quickstart.yaml": (8, 2, 16),
    "deploy/k8s/base/experiment.yaml": (8, 2, 16),
}


def test_every_shipped_experiment_keeps_its_allocation() -> None:
    shipped = {
        str(p.relative_to(REPO))
        for p in [*(REPO / "configs").glob("*.yaml"), *(REPO / "deploy").rglob("*.yaml")]
        if "\nrollout:" in "\n" + p.read_text()
    }
    assert shipped == set(SHIPPED_ALLOCATION)
    for name, expected in SHIPPED_ALLOCATION.items():
        a = load_config(REPO / name, env={}).allocator
        assert (a.n_per_prompt, a.n_min, a.n_max) == expected, name


def test_no_shipped_config_writes_a_parameter_twice() -> None:
    from dynamo_rl.config import ALIASES

    for name in SHIPPED_ALLOCATION:
        tree = yaml.safe_load((REPO / name).read_text())
        written = [a for a in ALIASES if a.split(".")[1] in (tree.get("rollout") or {})]
        assert not written, f"{name}: {written} (write {[ALIASES[a] for a in written]})"


def test_no_section_but_the_allocator_declares_an_allocation_parameter() -> None:
    """One declaration: the parameters' names (and the older rollout spellings) are fields of the
    allocator section alone."""
    from pydantic import BaseModel

    from dynamo_rl.config import ALIASES
    from dynamo_rl.contracts.allocator import AllocationParams

    names = set(AllocationParams.model_fields) | {a.split(".")[1] for a in ALIASES}

    def walk(model: type[BaseModel], where: str) -> list[str]:
        found = []
        for name, info in model.model_fields.items():
            if name in names and where != "allocator":
                found.append(f"{where}.{name}")
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                found += walk(ann, f"{where}.{name}" if where else name)
        return found

    assert walk(ExperimentConfig, "") == []
    assert set(AllocationParams.model_fields) <= set(
        type(ExperimentConfig().allocator).model_fields
    )


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "expected"),
    [
        ("rollout: {n_max: 20}\n", [], (8, 2, 20)),
        ("rollout: {n: 4, n_min: 1, n_max: 5}\n", [], (4, 1, 5)),
        ("allocator: {n_max: 24}\n", ["rollout.n_max=20"], (8, 2, 20)),
        ("rollout: {n_max: 24}\n", ["allocator.n_max=20"], (8, 2, 20)),
        ("rollout: {n_max: 24}\nallocator: {n_max: 24}\n", [], (8, 2, 24)),  # agreeing: fine
    ],
)
def test_a_rollout_spelling_loads_into_the_allocator_section(
    tmp_path: Path, yaml_text: str, overrides: list[str], expected: tuple[int, int, int]
) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml_text)
    a = load_config(path, overrides, env={}).allocator
    assert (a.n_per_prompt, a.n_min, a.n_max) == expected
    direct = ExperimentConfig.model_validate(yaml.safe_load(yaml_text)).allocator
    if not overrides:
        assert (direct.n_per_prompt, direct.n_min, direct.n_max) == expected


def test_one_parameter_given_twice_differently_names_both_keys(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("rollout: {n_max: 20}\nallocator: {n_max: 24}\n")
    with pytest.raises(ConfigError, match=r"rollout\.n_max \(20\) and allocator\.n_max \(24\)"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match=r"rollout\.n=4 and allocator\.n_per_prompt=8"):
        load_config(overrides=["rollout.n=4", "allocator.n_per_prompt=8"], env={})


def test_the_mean_must_lie_within_the_bounds_in_either_spelling() -> None:
    for overrides in (["rollout.n=50"], ["allocator.n_per_prompt=50"], ["rollout.n_min=9"]):
        with pytest.raises(ConfigError, match=r"allocator\.n_min <= allocator\.n_per_prompt"):
            load_config(overrides=overrides, env={})


def test_drop_uniform_groups_is_refused_where_it_contradicts_the_config() -> None:
    """The filler drops groups with zero group-relative advantage: another estimator finds a
    signal there, and one episode per group would leave nothing to train on."""
    for overrides, named in (
        (["learner.algorithm.advantage.type=reinforce_pp"], "learner.algorithm.advantage.type"),
        (["learner.algorithm.advantage.type=gae", "learner.critic.enabled=true"],
         "learner.algorithm.advantage.type"),
        (["allocator.n_per_prompt=1", "allocator.n_min=1"], "allocator.n_per_prompt"),
    ):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            load_config(None, ["rollout.drop_uniform_groups=true", *overrides], env={})
        assert "rollout.drop_uniform_groups" in str(err.value) and named in str(err.value)
        load_config(None, overrides, env={})  # fine without the switch
    for adv in ("grpo", "drgrpo", "rloo"):
        cfg = load_config(
            None, ["rollout.drop_uniform_groups=true", f"learner.algorithm.advantage.type={adv}"],
            env={},
        )  # fmt: skip
        assert cfg.rollout.drop_uniform_groups


def test_distillation_needs_a_teacher() -> None:
    """``learner.algorithm.opd`` trains on the teacher's log-probs: refused without
    ``rollout.teacher``, loaded with one (its required fields named when missing)."""
    with pytest.raises(ConfigError) as err:
        load_config(None, ["learner.algorithm.opd.weight=0.5"], env={})
    assert "learner.algorithm.opd.weight (0.5) needs rollout.teacher" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.teacher.engine_urls=[http://t:8000]"], env={})
    assert "rollout.teacher.tokenizer" in str(err.value)
    cfg = load_config(
        None, ["learner.algorithm.opd.weight=0.5", "rollout.teacher.engine_urls=[http://t:8000]",
               "rollout.teacher.tokenizer=/models/t"], env={},
    )  # fmt: skip
    assert cfg.rollout.teacher is not None and cfg.rollout.teacher.engine_urls == ["http://t:8000"]
    # Under `up`, up.teacher stands for it: up starts the teacher's engines and fills it in.
    cfg = load_config(None, ["learner.algorithm.opd.weight=0.5", "up.teacher.model=/models/t"],
                      env={})  # fmt: skip
    assert cfg.up.teacher is not None and cfg.up.teacher.engines == 1
    assert cfg.learner.algorithm.opd.weight == 0.5 and cfg.learner.algorithm.opd.outcome_weight == 1
