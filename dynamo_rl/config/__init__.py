"""Experiment configuration: one YAML file with a section per service, validated by pydantic.

Layering, lowest first: the schema's defaults, the YAML file, environment variables for addresses
and secrets (``ENV_VARS`` below), then dotted command-line overrides (``learner.lr=1e-6``).
Every section forbids unknown keys. Any mistake raises :class:`ConfigError`, whose message names the
dotted key, the value given and what is allowed; the command line prints it and exits 2 without a
traceback.

Each service owns the module that holds its section (``dynamo_rl/config/<service>.py``); this module
only assembles them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError, model_validator

from dynamo_rl.config.allocator import AllocatorConfig
from dynamo_rl.config.base import ConfigError, Section
from dynamo_rl.config.common import EndpointsConfig, RunConfig
from dynamo_rl.config.engine import EngineConfig
from dynamo_rl.config.learner import LearnerConfig
from dynamo_rl.config.reward import RewardConfig
from dynamo_rl.config.rollout import RolloutConfig
from dynamo_rl.config.up import UpConfig

__all__ = [
    "ALIASES",
    "ENV_VARS",
    "TOKEN_MEAN_REFUSAL",
    "AllocatorConfig",
    "ConfigError",
    "EndpointsConfig",
    "EngineConfig",
    "ExperimentConfig",
    "LearnerConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "Section",
    "UpConfig",
    "apply_overrides",
    "load_config",
]


ALIASES: dict[str, str] = {
    "rollout.n": "allocator.n_per_prompt",
    "rollout.n_min": "allocator.n_min",
    "rollout.n_max": "allocator.n_max",
}
"""Older spellings of keys declared elsewhere -> the one key. The batch's budget and bounds are
allocation parameters, declared once (``AllocationParams``, the ``allocator`` section); a YAML
file or an override may still write them under ``rollout``, and they load into the allocator
section. Written in both places, they must agree."""


def _move_aliases(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with every :data:`ALIASES` key moved to its one key (a new dict where anything
    moves); a :class:`ConfigError` when both are given with different values."""
    moves = []
    for alias, key in ALIASES.items():
        a_section, a_name = alias.split(".")
        section = tree.get(a_section)
        if isinstance(section, dict) and a_name in section:
            moves.append((alias, key))
    if not moves:
        return tree
    tree = {name: dict(v) if isinstance(v, dict) else v for name, v in tree.items()}
    for alias, key in moves:
        a_section, a_name = alias.split(".")
        k_section, k_name = key.split(".")
        value = tree[a_section].pop(a_name)
        target = tree.setdefault(k_section, {})
        if not isinstance(target, dict):
            continue  # the section's own error says what is wrong with it
        if k_name in target and target[k_name] != value:
            raise ConfigError(
                f"{alias} ({value!r}) and {key} ({target[k_name]!r}) are one parameter given "
                f"twice with different values; set {key} only"
            )
        target[k_name] = value
    return tree


GROUP_RELATIVE_ADVANTAGES = ("grpo", "drgrpo", "rloo")
"""Advantage estimators under which a group whose episodes all scored the same has zero
advantage everywhere: the ones ``rollout.drop_uniform_groups`` goes with."""

TOKEN_MEAN_REFUSAL = (
    "rollout.allocation: dynamic does not go with learner.algorithm.agg: token-mean: under "
    "token-mean a prompt's weight grows with its number of responses, so allocation biases the "
    "gradient toward the prompts it favours, and every allocator benchmarks/grad_variance.py "
    "measured raised the batch gradient's error to 1.13-2.51x uniform's (docs/benchmarks.md, "
    '"Allocation methods at equal budget"). Set learner.algorithm.agg: prompt-mean (DynaMO\'s '
    "recipes), or rollout.allocation: uniform, or allocator.allow_token_mean: true to run the "
    "pairing anyway"
)
"""The config's refusal of dynamic allocation under token-mean weighting (its fields, the figure,
the ways out)."""


class ExperimentConfig(Section):
    """One experiment: where the services are, and each service's settings."""

    run: RunConfig = RunConfig()
    endpoints: EndpointsConfig = EndpointsConfig()
    allocator: AllocatorConfig = AllocatorConfig()
    reward: RewardConfig = RewardConfig()
    engine: EngineConfig = EngineConfig()
    rollout: RolloutConfig = RolloutConfig()
    learner: LearnerConfig = LearnerConfig()
    up: UpConfig = UpConfig()

    @model_validator(mode="before")
    @classmethod
    def _aliases_to_their_keys(cls, data: Any) -> Any:
        # load_config moves them before the overrides apply; this covers a config built directly.
        return _move_aliases(data) if isinstance(data, dict) else data

    @model_validator(mode="before")
    @classmethod
    def _weight_api_from_kind(cls, data: Any) -> Any:
        # engine.kind=vllm implies vLLM's weight protocol unless rollout.weight_api is given.
        if isinstance(data, dict):
            engine, rollout = data.get("engine"), data.get("rollout")
            kind = engine.get("kind") if isinstance(engine, dict) else None
            if kind == "vllm" and (rollout is None or isinstance(rollout, dict)):
                rollout = dict(rollout or {})
                if "weight_api" not in rollout:
                    data = {**data, "rollout": {**rollout, "weight_api": "vllm"}}
        return data

    @model_validator(mode="after")
    def _kind_speaks_weight_api(self) -> ExperimentConfig:
        kind, api = self.engine.kind, self.rollout.weight_api
        if kind != "embedded" and kind != api:
            raise ValueError(
                f"engine.kind={kind} needs rollout.weight_api={kind} (got {api}): a {kind} "
                "server speaks only its own weight-update protocol"
            )
        if (
            self.rollout.allocation == "dynamic"
            and self.learner.algorithm.agg == "token-mean"
            and not self.allocator.allow_token_mean
        ):
            raise ValueError(TOKEN_MEAN_REFUSAL)
        if self.rollout.update_mode == "interrupt" and self.learner.lora.enabled:
            raise ValueError(
                "rollout.update_mode=interrupt does not go with learner.lora.enabled=true: an "
                "adapter push loads a new adapter version beside the running one, so generations "
                "in flight are never cut (use update_mode wait)"
            )
        return self

    @model_validator(mode="after")
    def _dropping_needs_group_advantages(self) -> ExperimentConfig:
        """The filler drops groups whose episodes all scored the same because their
        group-relative advantages are zero. Under another estimator such a group still has a
        signal (a critic's baseline, REINFORCE++'s batch whitening); and with one episode per
        group every group is dropped: the learner would never train."""
        if not self.rollout.drop_uniform_groups:
            return self
        adv = self.learner.algorithm.advantage.type
        if adv not in GROUP_RELATIVE_ADVANTAGES:
            raise ValueError(
                f"rollout.drop_uniform_groups=true does not go with "
                f"learner.algorithm.advantage.type={adv!r}: a group whose rewards are all equal "
                f"still has a signal there, and dropping it would throw that away (use one of "
                f"{', '.join(GROUP_RELATIVE_ADVANTAGES)}, or drop_uniform_groups=false)"
            )
        if self.allocator.n_per_prompt < 2:
            raise ValueError(
                f"rollout.drop_uniform_groups=true needs allocator.n_per_prompt >= 2 (got "
                f"{self.allocator.n_per_prompt}): a group of one episode is always uniform, and "
                "uniform allocation (or the allocator's fallback) gives every prompt "
                "n_per_prompt, so every group would be dropped and the learner never train"
            )
        return self

    @model_validator(mode="after")
    def _distillation_needs_a_teacher(self) -> ExperimentConfig:
        """``learner.algorithm.opd`` trains on the teacher log-probs that ``rollout.teacher``
        writes (``up.teacher`` fills it in); without a teacher every batch would be refused."""
        weight = self.learner.algorithm.opd.weight
        if weight > 0 and self.rollout.teacher is None and self.up.teacher is None:
            raise ValueError(
                f"learner.algorithm.opd.weight ({weight}) needs rollout.teacher (engine_urls, "
                "tokenizer) or, under dynamo-rl up, up.teacher.model: the distillation advantage "
                "needs the teacher's log-probs"
            )
        return self


# Environment variable -> dotted key. Addresses and secrets come from the environment in
# containers and clusters; an explicit command-line override still wins.
ENV_VARS: dict[str, str] = {
    "REDIS_URL": "endpoints.redis_url",
    "ALLOCATOR_ADDR": "endpoints.allocator_addr",
    "REWARD_URL": "endpoints.reward_url",
    "ENGINE_URLS": "endpoints.engine_urls",
    "DYNAMO_CONTROL_TOKEN": "endpoints.control_token",
}


def _parse_value(text: str) -> Any:
    """Parse an override's value as YAML scalar/list (``1e-6`` → float, ``[a, b]`` → list)."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def _keys(cls: Any) -> dict[str, Any] | None:
    """A section's keys and the type of each: a pydantic model's fields, or a dataclass's (e.g.
    ``rollout.sampling``, :class:`~dynamo_rl.contracts.sampling.SamplingParams`, whose keys are
    all values); None when ``cls`` is not a section."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return {name: f.annotation for name, f in cls.model_fields.items()}
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        return {f.name: None for f in dataclasses.fields(cls)}
    return None


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, model: type[BaseModel]) -> None:
    parts = ALIASES.get(dotted, dotted).split(".")
    if any(not p for p in parts):
        raise ConfigError(f"override {dotted!r}: empty key segment")
    node = tree
    keys = _keys(model)
    for i, part in enumerate(parts):
        if keys is not None:
            if part not in keys:
                where = ".".join(parts[:i]) or "<top level>"
                raise ConfigError(
                    f"{'.'.join(parts[: i + 1])}: unknown key under {where}; "
                    f"allowed: {', '.join(sorted(keys))}"
                )
            keys = _keys(keys[part])
        if i == len(parts) - 1:
            node[part] = value
        else:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child


def apply_overrides(tree: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings to a raw config tree (in place) and return it."""
    given: dict[str, tuple[str, Any]] = {}  # one key -> (spelling, value) of its last override
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. learner.lr=1e-6")
        key, value = key.strip(), _parse_value(raw)
        one = ALIASES.get(key, key)
        spelling, earlier = given.get(one, (key, value))
        if spelling != key and earlier != value:
            raise ConfigError(
                f"overrides {spelling}={earlier!r} and {key}={value!r} set one parameter ({one}) "
                "to different values; give it once"
            )
        given[one] = (key, value)
        _set_dotted(tree, key, value, ExperimentConfig)
    return tree


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the section at ``loc`` (for 'allowed:' hints)."""
    keys = _keys(ExperimentConfig)
    for part in loc:
        keys = _keys(keys.get(str(part))) if keys is not None else None
    return sorted(keys or ())


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<top level>"
        # An unknown key: a model's "extra" field, or a dataclass section's unknown argument.
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            allowed = _fields_at(e["loc"][:-1])
            lines.append(f"{key}: unknown key; allowed: {', '.join(allowed)}")
            continue
        value = e.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        if len(shown) > 80:
            shown = shown[:77] + "..."
        lines.append(f"{key}: {e['msg']} (got {shown})")
    return "invalid config:\n  " + "\n  ".join(lines)


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
) -> ExperimentConfig:
    """Build the experiment config from a YAML file, the environment and overrides."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            loaded = yaml.safe_load(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {p}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p}: expected a mapping of sections at the top level")
        # The file's aliases first: an override of either spelling then replaces the value.
        tree = _move_aliases(loaded)
    env = os.environ if env is None else env
    env_overrides = [f"{key}={env[var]}" for var, key in ENV_VARS.items() if env.get(var)]
    # Env values are taken as plain strings except lists (ENGINE_URLS=a,b).
    for item in env_overrides:
        key, _, raw = item.partition("=")
        value: Any = raw.split(",") if key == "endpoints.engine_urls" else raw
        _set_dotted(tree, key, value, ExperimentConfig)
    apply_overrides(tree, overrides)
    try:
        return ExperimentConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_errors(e)) from None
