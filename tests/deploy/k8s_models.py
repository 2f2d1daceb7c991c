"""Validate rendered Kubernetes objects against the API's own models (the ``kubernetes`` client).

The client's generated models know every field of every built-in kind with its JSON name and
type (``openapi_types`` / ``attribute_map``) and refuse a missing required field or a bad enum
value when built. :func:`validate` walks an object strictly (unknown fields, wrong types, wrong
list/map shapes are errors with their path, which is how a typo like ``replica:`` or
``containerport:`` is caught — the API server would drop or reject it) and then builds the model
with the client itself (``from_dict`` of its pydantic models, which forbid extra fields and check
required ones and types; the older deserializer on older clients).
"""

from __future__ import annotations

import datetime
import re
from typing import Any

# Fields the client types as "object": IntOrString, Quantity in some places, raw extensions.
# "bytes" are base64 text in YAML/JSON (Secret.data).
_SCALARS = {"str": str, "bytes": str, "bool": bool, "int": int, "float": (int, float)}


def model_class(api_version: str, kind: str) -> type:
    from kubernetes import client

    version = api_version.split("/")[-1]
    name = version[0].upper() + version[1:] + kind
    cls = getattr(client, name, None)
    if cls is None:
        raise ValueError(f"no Kubernetes model for {api_version} {kind} (looked for {name})")
    return cls


def _check(value: Any, type_name: str, path: str, errors: list[str]) -> None:
    from kubernetes import client

    if value is None:
        return
    if type_name == "object":
        return
    if type_name in _SCALARS:
        ok = isinstance(value, _SCALARS[type_name]) and not (
            type_name in ("int", "float") and isinstance(value, bool)
        )
        if not ok:
            errors.append(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")
        return
    if type_name in ("datetime", "date"):
        if not isinstance(value, str | datetime.date):
            errors.append(f"{path}: expected a timestamp, got {value!r}")
        return
    if m := re.fullmatch(r"[lL]ist\[(.+)\]", type_name):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _check(item, m.group(1), f"{path}[{i}]", errors)
        return
    if m := re.fullmatch(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])", type_name):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        for k, item in value.items():
            _check(item, m.group(1) or m.group(2), f"{path}.{k}", errors)
        return
    cls = getattr(client, type_name, None)
    if cls is None:
        errors.append(f"{path}: unknown model type {type_name}")
        return
    if not isinstance(value, dict):
        errors.append(f"{path}: expected an object ({type_name}), got {type(value).__name__}")
        return
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, item in value.items():
        attr = by_json.get(key)
        if attr is None:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
            continue
        _check(item, cls.openapi_types[attr], f"{path}.{key}", errors)


def validate(obj: dict[str, Any]) -> list[str]:
    """Errors of one object (empty when valid)."""
    from kubernetes.client import ApiClient

    for key in ("apiVersion", "kind", "metadata"):
        if key not in obj:
            return [f"missing {key}"]
    where = f"{obj['kind']}/{obj['metadata'].get('name', '?')}"
    try:
        cls = model_class(obj["apiVersion"], obj["kind"])
    except ValueError as e:
        return [f"{where}: {e}"]
    errors: list[str] = []
    _check(obj, cls.__name__, where, errors)
    if errors:
        return errors
    try:  # required fields, formats and enums, as the client's own models check them
        if hasattr(cls, "from_dict"):  # pydantic models (client >= 35)
            cls.from_dict(obj)
        else:
            ApiClient()._ApiClient__deserialize(obj, cls.__name__)
    except (ValueError, TypeError) as e:
        errors.append(f"{where}: {e}")
    return errors
