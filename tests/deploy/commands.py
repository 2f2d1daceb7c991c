"""What the deployment files ask our image to run, checked against the real command line.

- :func:`dynamo_command` finds the ``dynamo-rl`` subcommand in a container's argv (directly, or
  behind ``torchrun ... -m dynamo_rl.cli`` or its per-node form ``python -m learner.node ...``);
- :func:`check_command` checks it is a real subcommand, that every ``--flag`` is one its ``--help``
  lists, and that the config it would build (the experiment file, the environment, the
  ``KEY=VALUE`` overrides) validates;
- :func:`listen_ports` says on which ports the command serves what (from its flags, else the
  config), and ``ENDPOINTS`` which paths each service answers, so probes and healthchecks can be
  checked against them; tests/deploy/test_health_live.py starts the services and proves those paths
  answer.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dynamo_rl.cli import SUBCOMMANDS
from dynamo_rl.config import ExperimentConfig, load_config
from tests.conftest import REPO, dynamo_rl_argv

EXPERIMENT = REPO / "deploy" / "k8s" / "base" / "experiment.yaml"
COMPOSE_EXPERIMENT = REPO / "deploy" / "compose" / "quickstart.yaml"  # compose's default mount
CONFIG_MOUNT = "/etc/dynamo-rl/experiment.yaml"

# Config section a subcommand serves from (its ports, its bind address), when not its own name.
SECTION = {"vllm-server": "engine"}

# Paths each service answers over HTTP ("grpc-health": the standard gRPC health service), keyed by
# the kind of port they are on.
ENDPOINTS: dict[str, dict[str, set[str]]] = {
    "allocator": {"port": {"grpc-health"}, "metrics_port": {"/metrics"}},
    "reward": {"port": {"/healthz", "/metrics"}},
    "engine": {"port": {"/health", "/metrics"}},
    "vllm-server": {"port": {"/health", "/metrics"}},  # vLLM's own routes
    "rollout": {"metrics_port": {"/metrics"}},
    "learner": {"metrics_port": {"/metrics"}},
    "dashboard": {"port": {"/healthz", "/api/charts"}},
}


# The launchers that start ``-m dynamo_rl.cli`` ranks: torchrun, and torchrun run by learner.node.
LAUNCHERS = (["torchrun"], ["python", "-m", "learner.node"])


@dataclass
class DynamoCommand:
    subcommand: str
    args: list[str]  # what follows the subcommand


def dynamo_command(argv: Sequence[str]) -> DynamoCommand | None:
    """The ``dynamo-rl`` subcommand an argv runs, or None when it runs something else."""
    argv = list(argv)
    if argv and argv[0] == "dynamo-rl" and len(argv) > 1:
        return DynamoCommand(argv[1], argv[2:])
    if any(argv[: len(launcher)] == launcher for launcher in LAUNCHERS):
        for i in range(len(argv) - 2):
            if argv[i] == "-m" and argv[i + 1] == "dynamo_rl.cli":
                return DynamoCommand(argv[i + 2], argv[i + 3 :])
    return None


@functools.cache
def help_text(subcommand: str) -> str:
    result = subprocess.run(
        dynamo_rl_argv(subcommand, "--help"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, f"dynamo-rl {subcommand} --help failed:\n{result.stderr}"
    return result.stdout


def flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def substitute(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes-style ``$(VAR)`` expansion (unknown variables stay as they are)."""
    return re.sub(
        r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text
    )


def config_of(
    cmd: DynamoCommand, env: Mapping[str, str], experiment: Path = EXPERIMENT
) -> ExperimentConfig:
    """The config the command builds: the experiment file (``experiment`` for the mounted path),
    the env, the overrides, and the flags whose dest is a config key (the ones the deploy files
    use)."""
    args = [substitute(a, env) for a in cmd.args]
    config = flag_value(args, "--config")
    path: Path | None = None
    if config is not None:
        assert config == CONFIG_MOUNT, (
            f"--config {config}: the experiment is mounted at {CONFIG_MOUNT}"
        )
        path = experiment
    overrides = [a for a in args if not a.startswith("-") and "=" in a]
    section = SECTION.get(cmd.subcommand, cmd.subcommand)
    flag_keys = {
        "--port": f"{section}.port",
        "--host": f"{section}.host",
        "--metrics-port": f"{section}.metrics_port",
        "--metrics-host": f"{section}.metrics_host",
    }
    if section in ("allocator", "reward", "engine", "rollout"):
        for flag, key in flag_keys.items():
            value = flag_value(args, flag)
            if value is not None:
                overrides.append(f"{key}={value}")
    return load_config(path, overrides, env=dict(env))


def check_command(
    argv: Sequence[str], env: Mapping[str, str], experiment: Path = EXPERIMENT
) -> DynamoCommand:
    """Assert the argv runs a real subcommand with real flags and a valid config; return it."""
    cmd = dynamo_command(argv)
    assert cmd is not None, f"not a dynamo-rl command: {argv}"
    assert cmd.subcommand in SUBCOMMANDS, f"{cmd.subcommand!r} is not a dynamo-rl subcommand"
    text = help_text(cmd.subcommand)
    for a in cmd.args:
        if a.startswith("--"):
            flag = a.split("=", 1)[0]
            assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", text), (
                f"dynamo-rl {cmd.subcommand} has no flag {flag}"
            )
    if "--config" in text or any("=" in a and not a.startswith("-") for a in cmd.args):
        config_of(cmd, env, experiment)  # raises ConfigError on an unknown key or a bad value
    return cmd


def listen_ports(
    cmd: DynamoCommand, env: Mapping[str, str], experiment: Path = EXPERIMENT
) -> dict[str, int]:
    """Kind of port ("port", "metrics_port") -> the port number the command binds."""
    args = [substitute(a, env) for a in cmd.args]
    sub = cmd.subcommand
    if sub == "dashboard":
        return {"port": int(flag_value(args, "--port") or 8265)}
    cfg = config_of(cmd, env, experiment)
    section = getattr(cfg, SECTION.get(sub, sub))
    ports: dict[str, int] = {}
    for kind in ("port", "metrics_port"):
        value = getattr(section, kind, None)
        if value:
            ports[kind] = int(value)
    return ports


def bind_host(
    cmd: DynamoCommand, env: Mapping[str, str], kind: str, experiment: Path = EXPERIMENT
) -> str:
    """The address the command binds for ``kind`` ("port" or "metrics_port")."""
    section = getattr(config_of(cmd, env, experiment), SECTION.get(cmd.subcommand, cmd.subcommand))
    if kind == "metrics_port" and hasattr(section, "metrics_host"):
        return section.metrics_host
    return section.host


def endpoint_ok(sub: str, port: int, path: str, ports: Mapping[str, int]) -> bool:
    """Whether ``sub``, binding ``ports``, answers ``path`` on ``port``."""
    return any(ports.get(kind) == port and path in paths for kind, paths in ENDPOINTS[sub].items())
