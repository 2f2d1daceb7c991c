"""``docker compose up`` for real: images built, the stack trained, containers killed.

On this machine, as CI does it (``scripts/docker_local.sh``): a Docker engine started on its own
socket with its data in a cache folder outside the repository, the local base images made when
missing (no registry is reachable), the project image built, then the quickstart recipe as
compose runs it, with a shorter warm start and fewer steps:

1. ``docker compose up -d --wait``: ``prepare`` (task data, tiny model, warm start), the services,
   ``eval-before`` and the learner; it returns with the one-shots completed, each service healthy
   and ``eval-after`` running (it waits for the learner's last step); then the rollout worker,
   ``up -d --wait`` again (held back so that the learner cannot finish before ``--wait`` has seen
   it healthy);
2. learner steps with weight pushes; then the learner's container crashes (SIGKILL of its pid 1
   from the host, as the OOM killer would): restarted by its policy, it resumes from its checkpoint
   and training goes on;
3. the engine's container crashes the same way in mid-training (the learner held with ``docker
   pause`` until the engine is back, so that training is still going on whatever its speed):
   restarted, it gets current weights (its version at least the step reached) and training goes on;
4. ``docker kill`` of the learner: a manual stop, which Docker does not undo whatever the restart
   policy (still down after the next step); ``docker compose up -d --wait`` (the rollout worker
   stopped and started last, as in 1) brings it back, it
   resumes, and ``eval-before`` (run again with the other one-shot) keeps its first figure;
5. meanwhile the code sandbox works inside the reward container under the shipped seccomp profile,
   and the sandbox attacks still fail there (tests/deploy/compose_probe.py);
6. the learner reaches learner.max_steps and exits 0; ``eval-after`` measures held-out accuracy;
   no stream entry lost: every entry the learner's group read is listed by exactly one committed
   checkpoint, nothing pending, nothing dead-lettered (as tests/reliability/test_faults_up.py);
   ``down -v``, and the engine stopped by its pid.

This test fails (it does not skip) when the engine cannot start: set DYNAMO_RL_SKIP_COMPOSE=1 to
skip it on a machine without root or Docker.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis
import yaml

from dynamo_rl import keys
from dynamo_rl.codec import decode_entry
from dynamo_rl.procs import free_port
from tests.conftest import REPO
from tests.reliability.helpers import audit_stream

pytestmark = [pytest.mark.compose, pytest.mark.slow]

SCRIPT = REPO / "scripts" / "docker_local.sh"
PROBE = Path(__file__).with_name("compose_probe.py")
STEPS = 24
NAME = "compose-ci"
# Started (with their dependencies, the one-shots prepare and eval-before): everything but
# Grafana (no image here).
SERVICES = [
    "redis",
    "allocator",
    "reward",
    "engine",
    "rollout",
    "learner",
    "dashboard",
    "prometheus",
    "eval-after",
]


def _sh(argv: Sequence[str], env: dict[str, str], timeout: float, check: bool = True) -> str:
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if check and r.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )
    return r.stdout


def _wait(what: str, cond: Callable[[], bool], timeout: float, on_fail: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{on_fail()}")
        time.sleep(1)


@pytest.fixture(scope="module")
def engine_env() -> Iterator[dict[str, str]]:
    if os.environ.get("DYNAMO_RL_SKIP_COMPOSE") == "1":
        pytest.skip("DYNAMO_RL_SKIP_COMPOSE=1")
    env = dict(os.environ)
    r = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True,
                       timeout=600, cwd=REPO)  # fmt: skip
    if r.returncode != 0:
        pytest.fail(
            "could not start a Docker engine (scripts/docker_local.sh start; needs root and "
            f"apt, or set DYNAMO_RL_SKIP_COMPOSE=1):\n{r.stdout}\n{r.stderr[-3000:]}"
        )
    for word in r.stdout.split():  # export DOCKER_HOST=... DOCKER_CONFIG=... DOCKER_BUILDKIT=0
        if "=" in word:
            k, v = word.split("=", 1)
            env[k] = v
    try:
        t0 = time.monotonic()
        _sh(["bash", str(SCRIPT), "images"], env, timeout=1800)
        print(f"images ready in {time.monotonic() - t0:.0f}s")
        yield env
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], timeout=120, cwd=REPO, check=False)


class Stack:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.data = tmp / "data"
        self.data.mkdir()
        os.chown(self.data, 10001, 10001)  # the image's uid writes the run folder
        self.redis_port = free_port()
        self.project = f"dynamo-rl-ci-{secrets.token_hex(3)}"
        exp = yaml.safe_load((REPO / "deploy" / "compose" / "quickstart.yaml").read_text())
        exp["run"]["name"] = NAME
        # Small enough for a shared 2-core machine; still a warm start (a fresh model scores 0).
        # A fixed 300 steps, unchecked: its tiers would stay below min_tier_accuracy.
        exp["up"]["warm_start"].update(steps=300, check_rows=0, target_exact=None)
        exp["up"]["eval"] = {"prompts": 100, "samples": 2, "temperature": 1.0}
        exp["learner"]["max_steps"] = STEPS
        exp["learner"]["checkpoint"] = {"every": 2, "keep": 100, "export_every": 0}
        (tmp / "experiment.yaml").write_text(yaml.safe_dump(exp))
        # Host-side view of the run folder and of Redis; no other published port (other jobs on
        # this machine may hold 8000/8265/9090).
        (tmp / "ci.yml").write_text(
            yaml.safe_dump(
                {
                    "services": {
                        "redis": {"ports": [f"127.0.0.1:{self.redis_port}:6379"]},
                        "engine": {"ports": "RESET"},
                        "dashboard": {"ports": "RESET"},
                        "prometheus": {"ports": "RESET"},
                        "grafana": {"ports": "RESET"},
                    },
                    "volumes": {
                        "data": {
                            "driver": "local",
                            "driver_opts": {"type": "none", "o": "bind", "device": str(self.data)},
                        }
                    },
                }
            ).replace("RESET", "!reset []")
        )
        self.env = {
            **env,
            "DYNAMO_CONTROL_TOKEN": secrets.token_hex(32),
            "GRAFANA_ADMIN_PASSWORD": secrets.token_hex(12),
            "DYNAMO_EXPERIMENT": str(tmp / "experiment.yaml"),
            "REDIS_IMAGE": "dynamo-rl-base/redis:7",
            "PROMETHEUS_IMAGE": "dynamo-rl-base/prometheus:2",
        }
        self.base = ["docker", "compose", "-p", self.project, "-f", str(REPO / "docker-compose.yml"),
                     "-f", str(tmp / "ci.yml")]  # fmt: skip
        self.run_dir = self.data / "run"

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        return _sh([*self.base, *args], self.env, timeout, check)

    def logs(self, *services: str) -> str:
        return self.compose("logs", "--no-color", "--tail", "40", *services, check=False)[-6000:]

    def records(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]

    def steps(self) -> int:
        return max((int(r["step"]) for r in self.records()), default=0)

    def container(self, service: str) -> str:
        return self.compose("ps", "-a", "-q", service).strip()

    def inspect(self, service: str, fmt: str) -> str:
        return _sh(["docker", "inspect", "-f", fmt, self.container(service)], self.env, 60).strip()

    def docker(self, *args: str) -> str:
        return _sh(["docker", *args], self.env, 120)

    def pause(self, service: str, timeout: float = 120) -> None:
        """``docker pause``, tried again while the runtime answers "unable to freeze" (the cgroup
        freezer did not settle within the runtime's short wait, as seen once in CI just after the
        learner's restart; the runtime leaves the container thawed when it gives up)."""
        argv = ["docker", "pause", self.container(service)]
        deadline = time.monotonic() + timeout
        while True:
            r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                return
            if "unable to freeze" not in r.stderr or time.monotonic() > deadline:
                pytest.fail(f"{' '.join(argv)} exited {r.returncode}:\n{r.stderr[-3000:]}")
            time.sleep(1)

    def unpause(self, service: str) -> None:
        self.docker("unpause", self.container(service))

    def engine_version(self) -> int:
        """The engine's weight version, read inside its container (its port is not published)."""
        code = (
            "import json, urllib.request; print(json.load(urllib.request.urlopen("
            "'http://127.0.0.1:8000/get_weight_version', timeout=30))['weight_version'])"
        )
        return int(self.compose("exec", "-T", "engine", "python", "-c", code).strip())


def test_compose_trains_recovers_and_loses_nothing(engine_env: dict[str, str], tmp_path: Path):
    if shutil.which("docker") is None:
        pytest.fail("no docker client on PATH")
    stack = Stack(tmp_path, engine_env)
    t0 = time.monotonic()
    try:
        # 1. `up -d --wait`: the one-shots prepare and eval-before completed (services wait for
        # them), every service healthy, eval-after running (it waits for the learner's last step).
        # A deadline for a loaded machine: at load 60-70 on 2 cores the 300-step warm start alone
        # took over 15 minutes (a few minutes idle).
        _up_rollout_last(stack, 1800)
        for service in SERVICES:
            # (The learner was seen healthy by the first `--wait`; its health checks fail while
            # it is held, so its status is checked as running here.)
            if service not in ("eval-after", "learner"):
                assert stack.inspect(service, "{{.State.Health.Status}}") == "healthy", service
        for service in ("eval-after", "learner"):
            assert stack.inspect(service, "{{.State.Status}}") == "running", service
        t_up = time.monotonic() - t0
        before = json.loads((stack.run_dir / "eval_before.json").read_text())

        # 2. A learner crash (its pid 1 killed from the host, as the OOM killer would): restarted
        # by its policy, it resumes from its checkpoint (the steps after step 3 below, and its log's
        # second "resumed from").
        _wait("learner step 3", lambda: stack.steps() >= 3, 600, lambda: stack.logs("learner"))
        _crash_and_wait_restart(stack, "learner")

        # 3. An engine crash in mid-training. The restarted learner is held (paused) until the
        # engine is back, so that steps remain to be trained on the restarted engine however fast
        # training runs (on an idle machine a step here takes well under a second); the restarted
        # engine serves the weights it was started with until the learner pushes to it again (the
        # next push, or the catch-up push while the learner waits).
        stack.pause("learner")
        try:
            assert stack.steps() + 3 < STEPS, "too few steps left for the engine's restart"
            _crash_and_wait_restart(stack, "engine")
            _wait("engine healthy", lambda: stack.inspect("engine", "{{.State.Health.Status}}")
                  == "healthy", 400, lambda: stack.logs("engine"))  # fmt: skip
        finally:
            stack.unpause("learner")
        at_restart = stack.steps()
        _wait_steps(stack, 2, "after the learner's and the engine's restarts")
        # Held again while the engine is read, so that training cannot reach max_steps before
        # step 4's `docker kill`.
        stack.pause("learner")
        try:
            # The restarted engine holds weights pushed after its restart (a version it was not
            # started with, at least the step training had reached).
            version = stack.engine_version()
            assert version >= at_restart, (version, at_restart)
            assert stack.steps() < STEPS, "the learner finished before `docker kill`"
            restarts = stack.inspect("learner", "{{.RestartCount}}")
        finally:
            stack.unpause("learner")

        # 4. `docker kill`: a manual stop to Docker, which leaves the container down whatever
        # its restart policy; `docker compose up -d --wait` (what a user runs) brings it back, and
        # it resumes. The sandbox probe runs meanwhile (tens of seconds): the learner stays down.
        killed = stack.container("learner")
        stack.docker("kill", killed)
        _wait("the learner to stop", lambda: stack.inspect("learner", "{{.State.Status}}") ==
              "exited", 60, lambda: stack.logs("learner"))  # fmt: skip

        # 5. The sandbox, inside the reward container under the shipped seccomp profile.
        opts = stack.inspect("reward", "{{json .HostConfig.SecurityOpt}}")
        assert "seccomp=" in opts and "unconfined" not in opts.split("seccomp=")[1].split('"')[0]
        probe_run = subprocess.run(
            [*stack.base, "exec", "-T", "reward", "python", "-"], input=PROBE.read_text(),
            env=stack.env, capture_output=True, text=True, timeout=180, cwd=REPO, check=False,
        )  # fmt: skip
        assert probe_run.returncode == 0, probe_run.stderr[-3000:]
        probe = json.loads(probe_run.stdout)
        _check_sandbox(probe)

        assert stack.inspect("learner", "{{.State.Status}} {{.RestartCount}}") == (
            f"exited {restarts}"
        ), "Docker restarted a container stopped by `docker kill`"
        stack.compose("stop", "rollout")  # no new groups until the learner is seen healthy
        _up_rollout_last(stack, 600)
        assert stack.inspect("learner", "{{.State.Status}}") == "running"
        # The one-shots ran again; eval-before kept its first measurement.
        assert json.loads((stack.run_dir / "eval_before.json").read_text()) == before
        assert "measured when the stack first started" in stack.compose(
            "logs", "--no-color", "eval-before"
        )

        # 6. Done at max_steps (exit 0: not restarted), then eval-after's evaluation.
        _wait(
            "the learner to finish",
            lambda: stack.inspect("learner", "{{.State.Status}} {{.State.ExitCode}}") == "exited 0",
            600,
            lambda: stack.logs("learner"),
        )
        t_train = time.monotonic() - t0
        _wait(
            "eval-after to finish",
            lambda: stack.inspect("eval-after", "{{.State.Status}}") == "exited",
            600,
            lambda: stack.logs("eval-after"),
        )
        assert stack.inspect("eval-after", "{{.State.ExitCode}}") == "0", stack.logs("eval-after")
        after = json.loads((stack.run_dir / "eval_after.json").read_text())
        summary = json.loads((stack.run_dir / "summary.json").read_text())
        _check_stream(stack)
        records = stack.records()
        print(
            f"compose: up --wait (prepare, warm start, eval-before) {t_up:.0f}s, to max_steps "
            f"{t_train:.0f}s, total {time.monotonic() - t0:.0f}s; held-out {before['accuracy']:.3f}"
            f" -> {after['accuracy']:.3f}; reward by step "
            + " ".join(f"{r['reward_mean']:.2f}" for r in records)
        )
        assert summary["accuracy_before"] == before["accuracy"]
        learner_log = stack.compose("logs", "--no-color", "learner")
        # Both restarts resumed (the logs of one container; a container `up` recreated would have
        # lost its predecessor's, which the message says, with the steps the learner logged).
        assert learner_log.count("resumed from") == 2, (
            f"container recreated by up: {stack.container('learner') != killed}; restarts "
            f"{stack.inspect('learner', '{{.RestartCount}}')}; steps {[r['step'] for r in records]}"
            f"; resumes {[ln for ln in learner_log.splitlines() if 'resumed from' in ln]}\n"
            + learner_log[-3000:]
        )
        # It trains a warm-started model (the failure this guards against: a fresh one, every
        # reward 0, loss 0, grad norm 0), pushing weights to the engine. At this model's reward
        # level (a few percent) a step whose rewards are all equal comes up by chance; its
        # gradient is exactly 0, so only the steps with a signal must move the weights.
        assert any(r["reward_mean"] > 0 for r in records[:3]), "reward 0: a fresh model?"
        signal = [r for r in records if not r["rewards_all_equal"]]
        assert len(signal) * 2 >= len(records), f"most steps without a signal: {records}"
        assert all(r["grad_norm"] > 0 for r in signal), "grad norm 0: nothing learned"
    finally:
        stack.compose("down", "-v", "--remove-orphans", "--timeout", "20", timeout=300, check=False)
    left = _sh(["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={stack.project}"],
               stack.env, 60)  # fmt: skip
    assert left.strip() == ""


def _up_rollout_last(stack: Stack, wait_timeout: int) -> None:
    """``up -d --wait``, the rollout worker last, and the learner held (paused) until the worker
    is healthy: health checks come 15 s apart and on an idle machine the steps here take less, so
    the learner could otherwise train to ``max_steps`` and exit before ``--wait`` has seen it
    healthy (which fails ``--wait``), or before the test's faults."""
    first = [s for s in SERVICES if s != "rollout"]
    stack.compose("up", "-d", "--wait", "--wait-timeout", str(wait_timeout), *first,
                  timeout=wait_timeout + 100)  # fmt: skip
    stack.pause("learner")
    try:
        stack.compose("up", "-d", "--no-deps", "--wait", "--wait-timeout", "600", "rollout",
                      timeout=700)  # fmt: skip
    finally:
        stack.unpause("learner")


def _wait_steps(stack: Stack, more: int, what: str) -> None:
    target = stack.steps() + more
    _wait(f"step {target} {what}", lambda: stack.steps() >= target, 400,
          lambda: stack.logs("learner", "engine", "rollout"))  # fmt: skip


def _crash_and_wait_restart(stack: Stack, service: str) -> None:
    """SIGKILL of the container's pid 1 from the host, as the OOM killer or a crash would end it
    (Docker counts ``docker kill`` as a manual stop and leaves the container down whatever its
    restart policy: step 4); then wait for the restart."""
    restarts = int(stack.inspect(service, "{{.RestartCount}}"))
    os.kill(int(stack.inspect(service, "{{.State.Pid}}")), signal.SIGKILL)
    _wait(f"{service} restarted",
          lambda: int(stack.inspect(service, "{{.RestartCount}}")) > restarts
          and stack.inspect(service, "{{.State.Status}}") == "running",
          120, lambda: stack.logs(service))  # fmt: skip


def _check_sandbox(probe: dict) -> None:
    res = probe["results"]
    assert probe["seccomp"] == "2", "the reward service runs without a seccomp filter"
    assert res["plain"]["stdout"].strip() == "42", res["plain"]
    assert "CONNECTED" not in res["network"]["stdout"], res["network"]
    assert res["network"]["stdout"].count("refused") == 3, res["network"]
    assert probe["token"] and probe["token"] not in res["environ"]["stdout"], "token leaked"
    assert "READ" not in res["files"]["stdout"], res["files"]
    assert res["files"]["stdout"].count("denied") == 4, res["files"]
    lines = dict(line.split(" ", 1) for line in res["unshare"]["stdout"].splitlines())
    assert lines["unshare-user"].split()[0] == "-1", res["unshare"]
    for call in ("keyctl", "bpf"):  # refused by the profile (EPERM) or inside the sandbox
        assert lines[call].split()[0] == "-1", res["unshare"]


def _check_stream(stack: Stack) -> None:
    client = redis.Redis(port=stack.redis_port)
    audit_stream(stack.run_dir, client, NAME)
    entries = client.xrange(keys.trajectory_stream(NAME))
    for _eid, fields in entries:
        group_ = decode_entry(fields)
        assert len(group_.responses) == group_.allocated_n, "a half-written group"
