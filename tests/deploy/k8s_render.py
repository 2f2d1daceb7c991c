"""Render deploy/k8s with ``kubectl kustomize`` as an operator does: a copy of the tree with the
``tokens.env`` written before the first render, then one overlay's objects. Used by the manifest
checks (tests/deploy/test_k8s.py) and by the tests that run what a manifest runs (the learner's
two agents, tests/learner/test_two_nodes.py), so a manifest and its tests cannot drift."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO

K8S = REPO / "deploy" / "k8s"
KUBECTL = shutil.which("kubectl")
TOKEN = "t" * 64


def kustomize(root: Path, overlay: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBECTL), "kustomize", str(root / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def operator_tree(dest: Path) -> Path:
    """A copy of deploy/k8s at ``dest`` with the tokens file an operator writes (``TOKEN``)."""
    shutil.copytree(K8S, dest, ignore=shutil.ignore_patterns("tokens.env"))
    (dest / "base" / "tokens.env").write_text(f"DYNAMO_CONTROL_TOKEN={TOKEN}\n")
    return dest


def render(root: Path, overlay: str) -> list[dict[str, Any]]:
    """The objects ``overlay`` of the tree at ``root`` renders to (AssertionError on a failure)."""
    result = kustomize(root, overlay)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def objects(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}
