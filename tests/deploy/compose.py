"""Reading docker-compose.yml the way ``docker compose`` does, without a Docker engine.

YAML anchors and ``<<`` merge keys come from the YAML loader; :func:`interpolate` implements the
compose variable syntax the file uses (``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
``${VAR:?error}``, ``${VAR?error}``, ``$$``), failing like compose does when a required variable
is missing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO

COMPOSE = REPO / "docker-compose.yml"
COMPOSE_GPU = REPO / "deploy" / "compose.gpu.yml"
OUR_IMAGE = "${DYNAMO_IMAGE:-dynamo-rl:latest}"

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})"
)


class MissingVariable(ValueError):
    """A ``${VAR:?message}`` whose variable is unset (compose refuses to start)."""


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        name, op, arg = m.group("name"), m.group("op"), m.group("arg") or ""
        have = env.get(name)
        empty = have is None or (op is not None and op.startswith(":") and have == "")
        if op in (":-", "-"):
            return arg if empty else str(have)
        if op in (":?", "?"):
            if empty:
                raise MissingVariable(f"{name}: {arg}")
            return str(have)
        return "" if have is None else str(have)

    return _VAR.sub(sub, value)


def raw(path: Path = COMPOSE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``docker compose -f a -f b``: mappings merge, sequences of ports/devices/etc. replace."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load(env: Mapping[str, str], *files: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for f in files or (COMPOSE,):
        doc = merge(doc, raw(f))
    return interpolate(doc, env)


REQUIRED_ENV = {
    "DYNAMO_CONTROL_TOKEN": "test-token",
    "GRAFANA_ADMIN_PASSWORD": "test-password",
}
