"""docker-compose.yml, its GPU override, Prometheus' targets and the Dockerfiles, checked without
a Docker engine: the file parses and interpolates like compose, every command is a real
``dynamo-rl`` subcommand with real flags and a valid config, and every healthcheck and scrape
target names a port and path the service serves."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.deploy.commands import (
    COMPOSE_EXPERIMENT,
    ENDPOINTS,
    bind_host,
    check_command,
    endpoint_ok,
    listen_ports,
)
from tests.deploy.compose import (
    COMPOSE,
    COMPOSE_GPU,
    OUR_IMAGE,
    REQUIRED_ENV,
    MissingVariable,
    interpolate,
    load,
    raw,
)

HEALTH_URL = re.compile(r"urlopen\('http://127\.0\.0\.1:(\d+)(/[^']*)'")
HEALTH_GRPC = re.compile(r"grpc_healthy\('127\.0\.0\.1:(\d+)'\)")


@pytest.fixture(scope="module")
def compose() -> dict:
    return load(REQUIRED_ENV)


def ours(raw_service: dict) -> bool:
    return raw_service.get("image") == OUR_IMAGE


def test_parses_and_refuses_to_start_without_its_secrets() -> None:
    doc = raw()
    assert set(doc["services"]) >= {
        "redis",
        "allocator",
        "reward",
        "engine",
        "rollout",
        "learner",
        "prometheus",
        "grafana",
    }
    for var, _value in REQUIRED_ENV.items():
        env = {k: v for k, v in REQUIRED_ENV.items() if k != var}
        with pytest.raises(MissingVariable, match=var):
            load(env)
    assert "${DYNAMO_CONTROL_TOKEN:?" in COMPOSE.read_text()


def test_interpolation_follows_compose_rules() -> None:
    env = {"A": "a", "EMPTY": ""}
    assert interpolate("${A} ${B:-b} ${EMPTY:-e} ${EMPTY-e} $$A", env) == "a b e  $A"
    with pytest.raises(MissingVariable, match="B: need B"):
        interpolate("${B:?need B}", env)
    with pytest.raises(MissingVariable):
        interpolate("${EMPTY:?x}", env)


@pytest.mark.parametrize("name", sorted(raw()["services"]))
def test_every_service_has_a_healthcheck_or_is_one_shot(compose: dict, name: str) -> None:
    service = compose["services"][name]
    if service.get("restart") == "no":  # one-shot jobs are waited for by completion
        return
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD" and len(test) > 1, test


@pytest.mark.parametrize(
    "name", sorted(n for n, s in raw()["services"].items() if s.get("image") == OUR_IMAGE)
)
def test_commands_are_real_subcommands_with_valid_config(compose: dict, name: str) -> None:
    service = compose["services"][name]
    check_command(service["command"], service["environment"], COMPOSE_EXPERIMENT)


@pytest.mark.parametrize(
    "name",
    sorted(
        n
        for n, s in raw()["services"].items()
        if s.get("image") == OUR_IMAGE and s.get("restart") != "no"
    ),
)
def test_healthchecks_hit_an_endpoint_the_service_serves(compose: dict, name: str) -> None:
    service = compose["services"][name]
    check = " ".join(service["healthcheck"]["test"][1:])
    cmd = check_command(service["command"], service["environment"], COMPOSE_EXPERIMENT)
    ports = listen_ports(cmd, service["environment"], COMPOSE_EXPERIMENT)
    if m := HEALTH_URL.search(check):
        port, path = int(m.group(1)), m.group(2)
    elif m := HEALTH_GRPC.search(check):
        port, path = int(m.group(1)), "grpc-health"
    else:
        pytest.fail(f"{name}: unrecognised healthcheck {check!r}")
    assert endpoint_ok(cmd.subcommand, port, path, ports), (
        f"{name}: healthcheck asks :{port}{path}, but dynamo-rl {cmd.subcommand} serves "
        f"{ENDPOINTS[cmd.subcommand]} on {ports}"
    )


def test_dependencies_wait_for_health(compose: dict) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dep, spec in (service.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            condition = spec["condition"]
            if services[dep].get("restart") == "no":
                assert condition == "service_completed_successfully", (name, dep)
            elif condition == "service_completed_successfully":
                # Only what runs to completion (the learner: restarted after a crash, not after
                # reaching max_steps) can be waited for by completion.
                assert services[dep].get("restart") == "on-failure", (name, dep)
            elif (name, dep) == ("eval-after", "learner"):
                # eval-after waits for the learner's last step itself (launcher/stage.py), so
                # that `up --wait` does not fail on a one-shot that exited.
                assert condition == "service_started", (name, dep)
            else:
                assert condition == "service_healthy", (name, dep)
                assert "healthcheck" in services[dep], dep
    # `up --wait` fails on an exited container unless a service waits for its completion: every
    # one-shot but eval-after (which outlives training) is such a dependency.
    waited = {d for s in services.values() for d, spec in (s.get("depends_on") or {}).items()
              if spec["condition"] == "service_completed_successfully"}  # fmt: skip
    one_shots = {n for n, s in services.items() if s.get("restart") == "no"}
    assert one_shots - waited == {"eval-after"}
    rollout = services["rollout"]["depends_on"]
    assert {"allocator", "reward", "engine", "prepare", "eval-before"} <= set(rollout)


def test_published_ports_bind_loopback_by_default(compose: dict) -> None:
    published = []
    for name, service in raw()["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("${BIND_ADDR:-127.0.0.1}:"), (name, port)
        published += [(name, p) for p in compose["services"][name].get("ports", [])]
    assert published and all(p.startswith("127.0.0.1:") for _n, p in published)
    exposed = load({**REQUIRED_ENV, "BIND_ADDR": "0.0.0.0"})
    assert all(p.startswith("0.0.0.0:") for p in exposed["services"]["grafana"]["ports"])


def test_redis_persists_with_aof_on_a_volume(compose: dict) -> None:
    redis = compose["services"]["redis"]
    cmd = redis["command"]
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    (volume,) = redis["volumes"]
    name, target = volume.split(":")[:2]
    assert target == "/data" and name in compose["volumes"]


def test_reward_is_sandbox_ready_and_has_no_route_out(compose: dict) -> None:
    reward = compose["services"]["reward"]
    assert reward["networks"] == ["internal"]
    assert compose["networks"]["internal"]["internal"] is True
    # What bubblewrap needs, and nothing more: no capabilities, no privilege escalation.
    assert reward["cap_drop"] == ["ALL"] and "cap_add" not in reward
    assert "privileged" not in reward
    assert "no-new-privileges:true" in reward["security_opt"]
    assert {"apparmor=unconfined", "systempaths=unconfined"} <= set(reward["security_opt"])
    # Seccomp stays on: the shipped allowlist, not unconfined (tests/deploy/test_seccomp.py).
    (seccomp,) = [o for o in reward["security_opt"] if o.startswith("seccomp=")]
    assert seccomp == "seccomp=./deploy/seccomp/reward.json"
    assert (REPO / seccomp.split("=", 1)[1]).is_file()
    assert reward["user"] == "10001:10001"
    # Everything that talks to the reward service is on its network.
    for peer in ("rollout", "dashboard", "prometheus"):
        assert "internal" in compose["services"][peer]["networks"], peer


@pytest.mark.parametrize("profile", ["sglang", "vllm"])
def test_engine_profiles_use_official_images_with_gpus(compose: dict, profile: str) -> None:
    service = compose["services"][profile]
    assert service["profiles"] == [profile]
    assert service["image"].split(":")[0] in ("lmsysorg/sglang", "vllm/vllm-openai")
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    check = " ".join(service["healthcheck"]["test"])
    port = int(HEALTH_URL.search(check).group(1))
    # The health port is the one the server listens on (from its own --port).
    assert str(port) == service["command"][service["command"].index("--port") + 1]
    if profile == "vllm":
        # The learner's push routes exist only in dev mode with a weight-transfer backend.
        assert service["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
        cmd = service["command"]
        assert json.loads(cmd[cmd.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
        # learner.lora's adapter pushes: runtime loading, the run folder the learner writes to.
        assert (
            "--enable-lora" in cmd
            and service["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
        )
        assert "data:/data:ro" in service["volumes"]


def test_gpu_override_reserves_gpus_and_keeps_real_commands() -> None:
    doc = load(REQUIRED_ENV, COMPOSE, COMPOSE_GPU)
    for name in ("learner", "engine"):
        service = doc["services"][name]
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"]
        cmd = check_command(service["command"], service["environment"], COMPOSE_EXPERIMENT)
        if name == "engine":
            ports = listen_ports(cmd, service["environment"], COMPOSE_EXPERIMENT)
            assert ports["port"] == 8000
    engine = doc["services"]["engine"]["command"]
    assert "engine.device=cuda" in engine


def test_bind_mounts_exist_in_the_repository(compose: dict) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), (name, source)
            elif not source.startswith("/"):
                assert source in compose["volumes"], (name, source)


def test_prometheus_scrapes_every_service_where_it_serves_metrics(compose: dict) -> None:
    prom = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    targets = {
        t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }
    services = compose["services"]
    scraped_ours = set()
    for target in targets:
        host, port = target.rsplit(":", 1)
        assert host in services, f"scrape target {target}: no compose service {host}"
        service = services[host]
        if raw()["services"][host].get("image") != OUR_IMAGE:
            continue
        cmd = check_command(service["command"], service["environment"], COMPOSE_EXPERIMENT)
        ports = listen_ports(cmd, service["environment"], COMPOSE_EXPERIMENT)
        assert endpoint_ok(cmd.subcommand, int(port), "/metrics", ports), target
        # Scraped from another container: a loopback bind would answer only its own healthcheck.
        kind = next(k for k, v in ports.items() if v == int(port))
        bound = bind_host(cmd, service["environment"], kind, COMPOSE_EXPERIMENT)
        assert bound not in ("127.0.0.1", "localhost", "::1"), f"{target}: binds {bound}"
        scraped_ours.add(cmd.subcommand)
    assert scraped_ours == {"allocator", "reward", "engine", "rollout", "learner"}


def test_grafana_is_provisioned_from_the_repository(compose: dict) -> None:
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert mounts["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    provider = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/dashboards/dynamo-rl.yml").read_text()
    )
    path = provider["providers"][0]["options"]["path"]
    assert mounts[path] == "./deploy/grafana/dashboards"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (REPO / mounts[path] / Path(home).name).is_file()
    source = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    assert source["url"] == "http://prometheus:9090" and "prometheus" in compose["services"]


def test_dashboard_scrapes_what_the_services_serve(compose: dict) -> None:
    services = compose["services"]
    args = services["dashboard"]["command"]
    urls = [args[i + 1] for i, a in enumerate(args) if a == "--scrape"]
    assert len(urls) == 5
    for url in urls:
        host, port, path = re.match(r"http://([^:/]+):(\d+)(/.*)", url).groups()
        service = services[host]
        cmd = check_command(service["command"], service["environment"], COMPOSE_EXPERIMENT)
        assert endpoint_ok(
            cmd.subcommand,
            int(port),
            path,
            listen_ports(cmd, service["environment"], COMPOSE_EXPERIMENT),
        )


# --- Dockerfiles --------------------------------------------------------------------------------


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _dockerignored(rel: str) -> bool:
    patterns = [
        p.strip()
        for p in (REPO / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    return any(
        Path(rel).match(p) or rel == p or rel.startswith(p.rstrip("/") + "/") for p in patterns
    )


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfile_builds_one_non_root_image_with_bubblewrap(dockerfile: str) -> None:
    steps = _instructions(REPO / dockerfile)
    kinds = [k for k, _ in steps]
    assert kinds.count("FROM") == 1
    user = [rest for k, rest in steps if k == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN")
    runs = " ".join(rest for k, rest in steps if k == "RUN")
    assert "bubblewrap" in runs and "tini" in runs
    assert re.search(r"torch==\$\{TORCH_VERSION\}", runs)
    # Every COPY source exists, is not excluded by .dockerignore, and the packages pyproject
    # installs are all copied in.
    copied = set()
    for kind, rest in steps:
        if kind == "COPY":
            *sources, _dest = shlex.split(rest)
            for src in sources:
                assert (REPO / src).exists(), src
                assert not _dockerignored(src), f"{src} is excluded by .dockerignore"
                copied.add(src.rstrip("/"))
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    assert packages <= copied, packages - copied
    assert {"pyproject.toml", "README.md"} <= copied
    entry = [rest for k, rest in steps if k == "ENTRYPOINT"]
    assert entry and "tini" in entry[-1]


def test_dockerignore_keeps_secrets_and_state_out_of_the_context() -> None:
    for rel in (".git", ".venv", "runs", "deploy/k8s/base/tokens.env"):
        assert _dockerignored(rel), rel
    for rel in ("dynamo_rl", "pyproject.toml", "README.md"):
        assert not _dockerignored(rel), rel
