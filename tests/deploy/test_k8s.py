"""deploy/k8s: both overlays render with ``kubectl kustomize`` and every object validates against
the Kubernetes API models; then what the objects mean is checked: real commands, probes on
endpoints that exist, services that select pods, security contexts, the reward service's network
policy, the learner's rendezvous."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import pytest

from dynamo_rl.config import load_config
from tests.conftest import REPO
from tests.deploy.commands import (
    EXPERIMENT,
    bind_host,
    check_command,
    config_of,
    dynamo_command,
    endpoint_ok,
    listen_ports,
)
from tests.deploy.k8s_models import validate
from tests.deploy.k8s_render import K8S, KUBECTL, TOKEN, kustomize, objects, operator_tree, render

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl (for kubectl kustomize)")
OVERLAYS = ("cpu", "gpu", "vllm")
# Not the bare overlay names: conftest skips every test with a "gpu" keyword on CPU machines.
OVERLAY_IDS = ("cpu-overlay", "gpu-overlay", "vllm-overlay")
# What runs the engine Deployment in each overlay (the vllm overlay: vLLM servers, engine.kind=vllm).
ENGINE_COMMAND = {"cpu": "engine", "gpu": "engine", "vllm": "vllm-server"}
WORKLOADS = ("Deployment", "StatefulSet", "Job")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/k8s with the tokens file an operator writes before the first render."""
    return operator_tree(tmp_path_factory.mktemp("k8s") / "k8s")


@pytest.fixture(scope="module")
def rendered(tree: Path) -> dict[str, list[dict[str, Any]]]:
    return {overlay: render(tree, overlay) for overlay in OVERLAYS}


def pod_templates(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]
        for d in docs
        if d["kind"] in WORKLOADS
    }


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment, with stand-ins for values Kubernetes fills in at run time."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[e["name"]] = TOKEN
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[e["name"]] = "10.0.0.7"
        else:
            env[e["name"]] = "0"
    return env


def dynamo_containers(docs: list[dict[str, Any]]):
    for where, template in pod_templates(docs).items():
        for c in template["spec"].get("initContainers", []) + template["spec"]["containers"]:
            if c["image"].startswith("dynamo-rl:"):
                yield where, template, c


def test_render_fails_without_the_tokens_file(tmp_path: Path) -> None:
    root = tmp_path / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("tokens.env"))
    result = kustomize(root, "cpu")
    assert result.returncode != 0 and "tokens.env" in result.stderr


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_every_object_validates_against_the_api_models(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    errors = [e for d in docs for e in validate(d)]
    assert not errors, "\n".join(errors)
    kinds = {d["kind"] for d in docs}
    assert kinds >= {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Service",
        "Deployment",
        "StatefulSet",
        "Job",
        "NetworkPolicy",
        "PersistentVolumeClaim",
    }
    assert set(objects(docs, "Deployment")) == {
        "allocator",
        "reward",
        "engine",
        "rollout",
        "dashboard",
    }
    assert all(
        d["metadata"].get("namespace") == "dynamo-rl" for d in docs if d["kind"] != "Namespace"
    )


def test_validator_rejects_typos_and_wrong_types() -> None:
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "replica": 2,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "spec": {"containers": [{"name": "c", "ports": [{"containerPort": "80"}]}]}
            },
        },
    }
    errors = validate(bad)
    assert any("spec.replica: unknown field" in e for e in errors), errors
    assert any("containerPort: expected int" in e for e in errors), errors
    missing_name = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"image": "x"}]},
    }
    assert validate(missing_name)
    assert validate({"apiVersion": "v1", "kind": "Gizmo", "metadata": {"name": "g"}})


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_experiment_config_and_secret(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    (config,) = objects(docs, "ConfigMap").values()
    text = config["data"]["experiment.yaml"]
    assert text == EXPERIMENT.read_text()
    load_config(EXPERIMENT, env={})
    (secret,) = objects(docs, "Secret").values()
    assert base64.b64decode(secret["data"]["DYNAMO_CONTROL_TOKEN"]).decode() == TOKEN
    # Pods refer to the generated (hashed) names, so a changed config rolls them.
    for _where, template, c in dynamo_containers(docs):
        for v in template["spec"].get("volumes", []):
            if "configMap" in v:
                assert v["configMap"]["name"] == config["metadata"]["name"]
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == secret["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_commands_are_real_subcommands_with_valid_config(rendered, overlay: str) -> None:
    seen = set()
    for where, _template, c in dynamo_containers(rendered[overlay]):
        cmd = check_command(c.get("command", []) + c.get("args", []), container_env(c))
        seen.add(cmd.subcommand)
        assert where  # for the assertion message context
    engine = ENGINE_COMMAND[overlay]
    assert seen == {"allocator", "reward", engine, "rollout", "learner", "dashboard", "task"}


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_probes_hit_endpoints_the_services_serve(rendered, overlay: str) -> None:
    for where, _template, c in dynamo_containers(rendered[overlay]):
        argv = c.get("command", []) + c.get("args", [])
        cmd = dynamo_command(argv)
        kind = where.split("/")[0]
        probes = {k: c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in c}
        if cmd.subcommand in ("task", "learner"):
            continue  # an init container, and a Job whose ranks only rank 0 serves metrics
        assert kind != "Deployment" or {"readinessProbe", "livenessProbe"} <= set(probes), where
        env = container_env(c)
        ports = listen_ports(cmd, env)
        named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        for name, probe in probes.items():
            if "httpGet" in probe:
                port = probe["httpGet"]["port"]
                port = named[port] if isinstance(port, str) else port
                target = (port, probe["httpGet"]["path"])
            elif "grpc" in probe:
                target = (probe["grpc"]["port"], "grpc-health")
            else:
                script = " ".join(probe["exec"]["command"])
                import re

                m = re.search(r"urlopen\('http://127\.0\.0\.1:(\d+)(/[^']*)'", script)
                assert m, (where, name, script)
                target = (int(m.group(1)), m.group(2))
            assert endpoint_ok(cmd.subcommand, *target, ports), (where, name, target, ports)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_prometheus_annotations_point_at_metrics(rendered, overlay: str) -> None:
    annotated = set()
    for where, template, c in dynamo_containers(rendered[overlay]):
        notes = template["metadata"].get("annotations", {})
        if notes.get("prometheus.io/scrape") != "true" or c in template["spec"].get(
            "initContainers", []
        ):
            continue
        cmd = dynamo_command(c.get("command", []) + c.get("args", []))
        port = int(notes["prometheus.io/port"])
        assert port in {p["containerPort"] for p in c["ports"]}, where
        ports = listen_ports(cmd, container_env(c))
        assert endpoint_ok(cmd.subcommand, port, notes["prometheus.io/path"], ports), where
        kind = next(k for k, v in ports.items() if v == port)
        bound = bind_host(cmd, container_env(c), kind)
        assert bound not in ("127.0.0.1", "localhost", "::1"), f"{where}: /metrics binds {bound}"
        annotated.add(cmd.subcommand)
    engine = ENGINE_COMMAND[overlay]
    assert annotated == {"allocator", "reward", engine, "rollout", "learner"}


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_services_select_pods_and_existing_ports(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    templates = pod_templates(docs)
    for name, svc in objects(docs, "Service").items():
        selector = svc["spec"]["selector"]
        matches = [
            t
            for t in templates.values()
            if all(t["metadata"]["labels"].get(k) == v for k, v in selector.items())
        ]
        assert matches, f"Service {name} selects no pod"
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            ok = any(
                target in (p.get("name"), p["containerPort"])
                for t in matches
                for c in t["spec"]["containers"]
                for p in c.get("ports", [])
            )
            assert ok, f"Service {name} port {port} has no matching container port"


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_pods_run_unprivileged_with_resources(rendered, overlay: str) -> None:
    for where, template in pod_templates(rendered[overlay]).items():
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"].get("runAsUser", 1) != 0, where
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (where, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
            assert not sc.get("privileged", False)
            for key in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][key]), (where, c["name"], key)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_reward_has_no_egress_and_a_sandbox_capable_pod(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    reward = objects(docs, "Deployment")["reward"]["spec"]["template"]
    policies = [
        p
        for p in objects(docs, "NetworkPolicy").values()
        if all(
            reward["metadata"]["labels"].get(k) == v
            for k, v in p["spec"]["podSelector"]["matchLabels"].items()
        )
    ]
    (policy,) = policies
    assert "Egress" in policy["spec"]["policyTypes"]
    assert policy["spec"].get("egress", []) == []
    spec = reward["spec"]
    assert spec["hostUsers"] is False
    # The shipped allowlist (deploy/seccomp/reward.json), as a node-local profile: never unconfined.
    assert spec["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "dynamo-rl/reward.json",
    }
    (c,) = spec["containers"]
    assert c["securityContext"]["procMount"] == "Unmasked"
    # Every other pod keeps the runtime's seccomp profile.
    for where, template in pod_templates(docs).items():
        if where != "Deployment/reward":
            assert template["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"


def test_redis_is_a_statefulset_with_a_volume_and_aof(rendered) -> None:
    redis = objects(rendered["cpu"], "StatefulSet")["redis"]
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    (c,) = redis["spec"]["template"]["spec"]["containers"]
    assert any(m["name"] == claim["metadata"]["name"] for m in c["volumeMounts"])
    assert c["args"][c["args"].index("--appendonly") + 1] == "yes"
    assert objects(rendered["cpu"], "Service")["redis"]["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_learner_is_an_indexed_job_with_a_rendezvous(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    job = objects(docs, "Job")["learner"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    env = container_env(c)
    assert int(env["LEARNER_NODES"]) == spec["completions"]
    rdzv = objects(docs, "Service")[pod["subdomain"]]["spec"]
    assert rdzv["clusterIP"] == "None" and rdzv["publishNotReadyAddresses"] is True
    # torchrun, run by the wrapper that names a node missing at the rendezvous (learner/node.py).
    assert c["command"] == ["python", "-m", "learner.node"]
    args = c["args"]
    master = next(a.split("=", 1)[1] for a in args if a.startswith("--master-addr="))
    assert master == f"learner-0.{pod['subdomain']}"  # pod 0's stable DNS name
    assert f"learner.push.master_address={master}" in args
    node_rank = next(e for e in c["env"] if e["name"] == "NODE_RANK")
    assert "job-completion-index" in node_rank["valueFrom"]["fieldRef"]["fieldPath"]
    port = next(a.split("=", 1)[1] for a in args if a.startswith("--master-port="))
    assert int(port) in {p["containerPort"] for p in c["ports"]}
    # Pod 0 waits for the other nodes this long, then fails (tests/learner/test_two_nodes.py).
    assert "--rdzv-conf=timeout=$(LEARNER_RDZV_TIMEOUT)" in args
    assert int(env["LEARNER_RDZV_TIMEOUT"]) >= 60


def test_overlays_differ_where_they_should(rendered) -> None:
    def gpus(docs, kind, name) -> str | None:
        (c,) = objects(docs, kind)[name]["spec"]["template"]["spec"]["containers"]
        return c["resources"]["limits"].get("nvidia.com/gpu")

    cpu, gpu = rendered["cpu"], rendered["gpu"]
    assert gpus(cpu, "Deployment", "engine") is None and gpus(cpu, "Job", "learner") is None
    assert gpus(gpu, "Deployment", "engine") == "1" and gpus(gpu, "Job", "learner") == "8"
    images = {c["image"] for _w, _t, c in dynamo_containers(gpu)}
    assert images == {"dynamo-rl:cuda"}
    assert {c["image"] for _w, _t, c in dynamo_containers(cpu)} == {"dynamo-rl:latest"}
    (engine,) = objects(gpu, "Deployment")["engine"]["spec"]["template"]["spec"]["containers"]
    assert "engine.device=cuda" in engine["args"]


def test_vllm_overlay_runs_vllm_servers_and_tells_their_clients(rendered) -> None:
    docs = rendered["vllm"]
    assert {c["image"] for _w, _t, c in dynamo_containers(docs)} == {"dynamo-rl:vllm"}
    (engine,) = objects(docs, "Deployment")["engine"]["spec"]["template"]["spec"]["containers"]
    cmd = check_command(engine["command"] + engine["args"], container_env(engine))
    assert cmd.subcommand == "vllm-server"
    cfg = config_of(cmd, container_env(engine))
    assert cfg.engine.kind == "vllm" and cfg.rollout.weight_api == "vllm"
    assert cfg.engine.vllm.python == "/opt/venv-vllm/bin/python"
    # Each pod registers its own address (the learner pushes to every replica), and vLLM's caches
    # land on the writable /tmp volume (the root filesystem is read-only).
    assert cfg.engine.advertise_url == "http://10.0.0.7:8000"
    assert cfg.engine.vllm.cache_dir and cfg.engine.vllm.cache_dir.startswith("/tmp/")
    assert any(m["mountPath"] == "/tmp" for m in engine["volumeMounts"])
    # The rollout workers and the learner speak vLLM's weight protocol.
    for kind, name in (("Deployment", "rollout"), ("Job", "learner")):
        (c,) = objects(docs, kind)[name]["spec"]["template"]["spec"]["containers"]
        cmd = check_command(c["command"] + c["args"], container_env(c))
        assert config_of(cmd, container_env(c)).rollout.weight_api == "vllm", name
    # The other overlays keep the embedded engine.
    for overlay in ("cpu", "gpu"):
        (c,) = objects(rendered[overlay], "Deployment")["engine"]["spec"]["template"]["spec"][
            "containers"
        ]
        assert c["command"] == ["dynamo-rl", "engine"]


def _fleet_module():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("fleet", REPO / "benchmarks" / "fleet.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fleet"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_replicas_follow_the_fleet_sizing_table(rendered, overlay: str) -> None:
    """The reward and allocator replica counts are what the fleet benchmark's projection
    (benchmarks/results/fleet.json, the table in docs/deploy.md) gives for the overlay's engine
    GPUs (none: the minimum, one)."""
    import json

    fleet = _fleet_module()
    proj = json.loads((REPO / "benchmarks" / "results" / "fleet.json").read_text())["projection"]
    docs = rendered[overlay]
    engine = objects(docs, "Deployment")["engine"]
    (c,) = engine["spec"]["template"]["spec"]["containers"]
    gpus = engine["spec"]["replicas"] * int(c["resources"]["limits"].get("nvidia.com/gpu", 0))
    costs = {
        "reward": (proj["reward_core_s_per_response"], proj["gpu_responses_per_s"]),
        "allocator": (
            proj["allocator_core_s_per_prompt"],
            proj["gpu_responses_per_s"] * fleet.PROMPTS_PER_STEP / fleet.RESPONSES_PER_STEP,
        ),
    }
    for svc, (cost, per_gpu) in costs.items():
        deployment = objects(docs, "Deployment")[svc]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        limit = str(container["resources"]["limits"]["cpu"])
        cores = float(limit[:-1]) / 1000 if limit.endswith("m") else float(limit)
        assert cores == fleet.REPLICA_CORES[svc], f"{svc}: the sizing assumes another CPU limit"
        want = fleet.replicas_for(gpus, cost, per_gpu, svc)
        assert deployment["spec"]["replicas"] == want, (svc, gpus)


def test_deploy_docs_carry_the_fleet_sizing_table() -> None:
    import json

    fleet = _fleet_module()
    proj = json.loads((REPO / "benchmarks" / "results" / "fleet.json").read_text())["projection"]
    assert fleet.sizing_markdown(proj) in (REPO / "docs" / "deploy.md").read_text()


def _claim_mounts(template: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """PVC name -> where the container mounts it."""
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in template["spec"].get("volumes", []) if "persistentVolumeClaim" in v}  # fmt: skip
    return {claims[m["name"]]: m["mountPath"] for m in container.get("volumeMounts", [])
            if m["name"] in claims}  # fmt: skip


@pytest.mark.parametrize("overlay", OVERLAYS, ids=OVERLAY_IDS)
def test_engines_read_the_run_folder_the_learner_writes_adapters_to(rendered, overlay: str) -> None:
    # learner.lora's pushes are peft folders under <run dir>/push that every engine loads by
    # path: the run folder must be on a volume the engines mount where the learner does.
    run_dir = load_config(EXPERIMENT, ["learner.lora.enabled=true"], env={}).run.run_dir
    templates = pod_templates(rendered[overlay])
    learner = templates["Job/learner"]
    engine = templates["Deployment/engine"]
    written = _claim_mounts(learner, learner["spec"]["containers"][0])
    read = _claim_mounts(engine, engine["spec"]["containers"][0])
    shared = [path for claim, path in written.items() if read.get(claim) == path]
    assert any(Path(run_dir).is_relative_to(path) for path in shared), (run_dir, written, read)
