"""The Grafana dashboard: valid layout, provisioned data source, and every metric (and label) it
queries exists in the services' metric registries, so a typo or a renamed metric fails here."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.conftest import REPO
from tests.deploy.registry import METRIC_CLASSES, service_of, service_registry

DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "dynamo-rl.json"
DATASOURCES = REPO / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
METRIC = re.compile(r"\b(dynamo_[a-z0-9_]+)\b")
SELECTOR = re.compile(r"\b(dynamo_[a-z0-9_]+)\{([^}]*)\}")
# Non-dynamo series a panel may query: Prometheus' own target health.
ALLOWED_OTHER = {"up"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def exprs() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def test_layout_is_valid() -> None:
    d = dashboard()
    assert d["uid"] == "dynamo-rl" and d["title"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['title']!r} overlaps another"
                cells.add((x, y))
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == ["Training", "Allocation", "Throughput", "Health"]


def test_panels_use_the_provisioned_data_source() -> None:
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    for p in panels():
        assert p["datasource"]["uid"] == source["uid"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == source["uid"], p["title"]
            assert t["expr"].strip(), p["title"]


def test_covers_what_the_issue_asks_for() -> None:
    used = {m for e in exprs() for m in METRIC.findall(e)}
    wanted = {
        # training
        "dynamo_learner_reward_mean",
        "dynamo_learner_accuracy_mean",
        "dynamo_learner_loss",
        "dynamo_learner_kl",
        "dynamo_learner_entropy",
        "dynamo_learner_beta_stab_mean",
        "dynamo_learner_beta_comp_mean",
        # allocation
        "dynamo_allocator_count_responses_bucket",
        "dynamo_allocator_priority_bucket",
        "dynamo_rollout_zero_advantage_responses_total",
        # throughput
        "dynamo_engine_generated_tokens_total",
        "dynamo_rollout_groups_total",
        "dynamo_learner_phase_seconds_sum",
        "dynamo_learner_push_seconds",
        # health
        "dynamo_rollout_pending_groups",
        "dynamo_rollout_staleness_versions",
        "dynamo_reward_rejections_total",
        "dynamo_learner_dead_letters_total",
        "dynamo_rollout_leases_reissued_total",
    }
    assert wanted <= used, wanted - used


def test_only_dynamo_metrics_or_known_others() -> None:
    for e in exprs():
        if not METRIC.search(e):
            names = set(re.findall(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]?", e))
            assert names <= ALLOWED_OTHER, e


def _labelnames(instances: list[object]) -> dict[str, set[str]]:
    """metric family name -> its label names, from the metric objects of the service classes."""
    out: dict[str, set[str]] = {}
    for instance in instances:
        for value in vars(instance).values():
            objs = value.values() if isinstance(value, dict) else [value]
            for obj in objs:
                if isinstance(obj, MetricWrapperBase):
                    out[obj._name] = set(obj._labelnames)
    return out


@pytest.mark.parametrize("service", sorted(METRIC_CLASSES))
def test_every_metric_and_label_exists_in_the_registry(service: str) -> None:
    used = {m for e in exprs() for m in METRIC.findall(e) if service_of(m) == service}
    reg = service_registry(service)  # fails, never skips, when the registry is not there
    assert used <= reg.names, f"not in the {service} registry: {sorted(used - reg.names)}"
    labels = _labelnames(reg.instances)
    for e in exprs():
        for name, selector in SELECTOR.findall(e):
            if service_of(name) != service:
                continue
            family = re.sub(r"_(total|bucket|sum|count|created)$", "", name)
            keys = {k for k in re.findall(r"([a-zA-Z_]+)\s*(?:=~|!=|!~|=)", selector)} - {"le"}
            assert keys <= labels.get(family, set()), f"{name}: no label(s) {keys} in {e}"
