"""The learner across machines, as the Kubernetes Job runs it: two ``torchrun`` agents on this
machine, node ranks 0 and 1 of ``--nnodes=2``, each started with the command, arguments and
environment of the rendered ``deploy/k8s/overlays/cpu`` learner Job (the two-node count set as the
gpu overlay sets it; the pod-0 DNS name replaced by 127.0.0.1, the mounted experiment file by the
rendered ConfigMap's text), so the manifest and these tests cannot drift. They rendezvous over
TCP, read a real Redis stream, checkpoint to one shared run folder, and rank 0 alone serves
``/metrics`` and pushes weights to a real embedded engine.

- Two agents train what one agent's two processes train, to the 1-vs-2-rank test's tolerance.
- SIGKILL of node 1's agent mid-run: both agents exit (as the Job's pods fail); restarted, they
  resume from the last checkpoint and every stream entry is trained exactly once.
- A node that never arrives: the other agent fails once the manifest's rendezvous timeout has
  passed, instead of hanging, and its last line names who is missing (``learner.node``): node 0
  names node rank 1, node 1 names node 0 and its address.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from dynamo_rl import keys
from dynamo_rl.procs import ServiceProcess, free_port, http_ok
from learner.steplog import read_log
from learner.tiny_model import build_tiny_model
from tests.conftest import REPO, dynamo_rl_argv
from tests.deploy.commands import CONFIG_MOUNT, substitute
from tests.deploy.k8s_render import KUBECTL, TOKEN, objects, operator_tree, render
from tests.learner.helpers import (
    FIXED_LAYOUT,
    FIXED_SIZES,
    RECIPE,
    assert_same_training,
    base_overrides,
    learner_env,
    make_groups,
    run_learner,
    write_groups,
)
from tests.reliability.helpers import audit_stream, process_tree

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None, reason="needs kubectl (to render the learner's Job)"),
]

NODES = 2
LOOPBACK = "127.0.0.1"


class Job:
    """The learner Job's pod, as the cpu overlay renders it."""

    def __init__(self, docs: list[dict[str, Any]], folder: Path) -> None:
        job = objects(docs, "Job")["learner"]
        (self.container,) = job["spec"]["template"]["spec"]["containers"]
        (config,) = objects(docs, "ConfigMap").values()
        self.experiment = folder / "experiment.yaml"  # what the pod mounts at CONFIG_MOUNT
        self.experiment.write_text(config["data"]["experiment.yaml"])

    def agent(
        self, node_rank: int, master_port: int, pod_env: dict[str, str], *overrides: str
    ) -> tuple[list[str], dict[str, str]]:
        """argv and environment of node ``node_rank``'s pod on this machine: the pod's env values
        (Kubernetes' ``$(VAR)`` expansion in the args), the fields Kubernetes fills in, then
        ``pod_env`` (what this machine's services are at) and the test's ``overrides`` last."""
        c = self.container
        filled = {"NODE_RANK": str(node_rank), "DYNAMO_CONTROL_TOKEN": TOKEN}
        env = {}
        for e in c["env"]:
            assert "value" in e or e["name"] in filled, f"no stand-in for the pod's {e['name']}"
            env[e["name"]] = e.get("value", filled.get(e["name"]))
        env.update(LEARNER_NODES=str(NODES), **pod_env)
        argv = [substitute(a, env) for a in c["command"] + c["args"]]
        assert argv[:3] == ["python", "-m", "learner.node"], argv
        master = next(a.split("=", 1)[1] for a in argv if a.startswith("--master-addr="))
        assert f"learner.push.master_address={master}" in argv  # engines join rank 0's group there
        argv = [a.replace(master, LOOPBACK) for a in argv]
        port_flag = next(i for i, a in enumerate(argv) if a.startswith("--master-port="))
        argv[port_flag] = f"--master-port={master_port}"
        config = argv.index("--config") + 1
        assert argv[config] == CONFIG_MOUNT, argv
        argv[config] = str(self.experiment)
        argv = [sys.executable, *argv[1:], *overrides]
        return argv, {**learner_env(), **env}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    folder = tmp_path_factory.mktemp("k8s")
    return Job(render(operator_tree(folder / "k8s"), "cpu"), folder)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "m", hidden_size=32, num_layers=2)


def _start_engine(service, model: Path, redis_url: str, name: str) -> str:
    """The embedded engine, registered in Redis under ``name``, with the pods' control token."""
    port = free_port()
    argv = dynamo_rl_argv("engine", "--model", str(model), "--port", str(port), f"run.name={name}",
                          f"endpoints.redis_url={redis_url}")  # fmt: skip
    url = f"http://{LOOPBACK}:{port}"
    service("engine", argv, http_ok(f"{url}/health"), timeout=120,
            env={"DYNAMO_CONTROL_TOKEN": TOKEN})  # fmt: skip
    return url


class Agents:
    """Both nodes' torchrun agents, started together on one rendezvous port."""

    def __init__(self, job: Job, folder: Path, pod_env: dict[str, str], overrides: list[str]):
        self.job, self.folder, self.pod_env, self.overrides = job, folder, pod_env, overrides
        self.master_port = free_port()  # the Service's port: the same on every restart
        self.nodes: list[ServiceProcess] = []
        self.starts = 0

    def start(self) -> Agents:
        self.starts += 1
        self.nodes = []
        for rank in range(NODES):
            argv, env = self.job.agent(rank, self.master_port, self.pod_env, *self.overrides)
            log = self.folder / f"node{rank}-{self.starts}.log"
            self.nodes.append(ServiceProcess(f"node{rank}", argv, log, env=env, cwd=REPO).start())
        return self

    def logs(self) -> str:
        return "\n".join(f"--- {n.name}:\n{n.log_tail(40)}" for n in self.nodes)

    def wait_exit(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while any(n.alive() for n in self.nodes):
            assert time.monotonic() < deadline, f"an agent still runs:\n{self.logs()}"
            time.sleep(0.2)
        return [n.proc.returncode for n in self.nodes]

    def stop(self) -> None:
        ranks = [p for n in self.nodes if n.alive() for p in process_tree(n.pid)[1:]]
        for n in self.nodes:
            n.stop(grace=5)
        for pid in ranks:  # a rank outliving its agent would be a bug; leave nothing behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _wait_for_step(agents: Agents, metrics: Path, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not any(r["step"] >= step for r in read_log(metrics)):
        assert all(n.alive() for n in agents.nodes), f"an agent exited:\n{agents.logs()}"
        assert time.monotonic() < deadline, f"no step {step} in time:\n{agents.logs()}"
        time.sleep(0.2)


def _listeners(port: int) -> set[int]:
    """Pids with a TCP socket listening on ``port`` (from /proc: the socket inodes)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    pids = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            target = fd.readlink().name
            if target.startswith("socket:[") and target[8:-1] in inodes:
                pids.add(int(fd.parts[2]))
    return pids


def _ranks(agent: ServiceProcess) -> list[int]:
    return process_tree(agent.pid)[1:]


def test_two_agents_train_like_one_agent_with_two_processes(
    job: Job, tiny_model: Path, redis_url: str, tmp_path: Path, service
) -> None:
    name, metrics_port = "twonodes", free_port()
    fixed = make_groups(4, sizes=FIXED_SIZES)
    engine = _start_engine(service, tiny_model, redis_url, name)
    # The agents read the overlay's experiment file, the lone agent the defaults: the weighting,
    # which the two differ in, is set for both.
    train = [*RECIPE, *FIXED_LAYOUT, "learner.max_steps=4", "learner.stream.wait_timeout_s=120",
             "learner.algorithm.agg=prompt-mean"]  # fmt: skip
    overrides = [
        *base_overrides(tiny_model, tmp_path / name, redis_url, name), *train,
        f"learner.metrics_port={metrics_port}", "learner.push.every=1",
        "learner.push.fallback_to_disk=false",
    ]  # fmt: skip
    # Three batches first: the agents train them and wait for the fourth, still serving.
    write_groups(redis_url, name, fixed * 3)
    agents = Agents(job, tmp_path, {"REDIS_URL": redis_url, "ENGINE_URLS": engine}, overrides)
    try:
        agents.start()
        _wait_for_step(agents, tmp_path / name / "metrics.jsonl", 3)
        # Rank 0 alone serves /metrics: the one listener on the port is node 0's rank.
        (rank0,) = _ranks(agents.nodes[0])
        assert _listeners(metrics_port) == {rank0}
        text = httpx.get(f"http://{LOOPBACK}:{metrics_port}/metrics", timeout=10).text
        assert "dynamo_learner_step 3.0" in text
        write_groups(redis_url, name, fixed)
        assert agents.wait_exit(180) == [0, 0], agents.logs()
    finally:
        agents.stop()
    two_nodes = read_log(tmp_path / name / "metrics.jsonl")
    assert [r["step"] for r in two_nodes] == [1, 2, 3, 4]
    # Rank 0 alone pushed: one update per step reached the engine, each acknowledged once.
    assert [(r["push_ok"], r["weight_version"]) for r in two_nodes] == [
        (True, v) for v in (1, 2, 3, 4)
    ]
    engine_metrics = httpx.get(f"{engine}/metrics", timeout=10).text
    assert (
        'dynamo_engine_weight_updates_total{outcome="ok",source="distributed"} 4.0'
        in engine_metrics
    )
    assert httpx.get(f"{engine}/get_weight_version").json()["weight_version"] == 4
    # One shared checkpoint folder, written by both nodes: a shard from each rank per step.
    for step in (2, 4):
        folder = tmp_path / name / "checkpoints" / f"step_{step:06d}"
        assert (folder / "COMMITTED").exists()
        assert {p.name for p in folder.rglob("*.distcp")} >= {"__0_0.distcp", "__1_0.distcp"}
    client = redis.Redis.from_url(redis_url)
    assert len(audit_stream(tmp_path / name, client, name)) == 16
    client.close()

    # The same work on one agent with two processes (no push: it does not change training).
    one = "oneagent"
    write_groups(redis_url, one, fixed * 4)
    run_learner(2, [*base_overrides(tiny_model, tmp_path / one, redis_url, one), *train],
                tmp_path / f"{one}.log")  # fmt: skip
    one_agent = read_log(tmp_path / one / "metrics.jsonl")
    assert_same_training(two_nodes, one_agent)
    pairs = [(a["loss"], b["loss"]) for a, b in zip(two_nodes, one_agent, strict=True)]
    print("loss per step, two agents vs one agent with two processes:", pairs)


def test_node_one_killed_both_agents_exit_and_resume_exactly_once(
    job: Job, tiny_model: Path, redis_url: str, tmp_path: Path
) -> None:
    name = "killnode"
    batches = [make_groups(4, seed=s) for s in range(4)]  # a different batch every step
    overrides = [*base_overrides(tiny_model, tmp_path / name, redis_url, name), *RECIPE,
                 "learner.max_steps=4", "learner.stream.wait_timeout_s=120"]  # fmt: skip
    metrics = tmp_path / name / "metrics.jsonl"
    # Three batches: checkpoint at step 2, step 3 trained (not checkpointed), then a wait.
    write_groups(redis_url, name, [g for b in batches[:3] for g in b])
    agents = Agents(job, tmp_path, {"REDIS_URL": redis_url}, overrides)
    client = redis.Redis.from_url(redis_url)
    try:
        agents.start()
        _wait_for_step(agents, metrics, 3)
        ranks = [p for n in agents.nodes for p in _ranks(n)]
        assert len(ranks) == NODES
        os.kill(agents.nodes[1].pid, signal.SIGKILL)  # node 1's pod dies
        # The fourth batch arrives: rank 0 hands it to a peer that is gone.
        killed = time.monotonic()
        write_groups(redis_url, name, batches[3])
        codes = agents.wait_exit(120)
        print(f"both agents exited {time.monotonic() - killed:.1f} s after the kill: {codes}")
        assert codes[1] == -signal.SIGKILL and codes[0] not in (0, None), agents.logs()
        deadline = time.monotonic() + 20
        while any(Path(f"/proc/{p}").exists() for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in ranks if Path(f"/proc/{p}").exists()], "a rank outlived its agent"
        stream, group = keys.trajectory_stream(name), keys.learner_group(name)
        assert client.xpending(stream, group)["pending"] >= 4  # step 3's groups, not acknowledged

        # The Job's back-off restarts both pods: same rendezvous port, same checkpoint folder.
        agents.start()
        assert agents.wait_exit(240) == [0, 0], agents.logs()
        assert "resumed from" in agents.nodes[0].log_path.read_text()
    finally:
        agents.stop()
    steps = [r["step"] for r in read_log(metrics)]
    assert steps == [1, 2, 3, 3, 4], (
        steps
    )  # step 3 again after the restart, from step 2's checkpoint
    committed = audit_stream(tmp_path / name, client, name)
    client.close()
    assert len(committed) == 16
    last = {r["step"]: r for r in read_log(metrics)}  # the lineage: a redone step replaces the lost
    trained = [eid for r in last.values() for eid in r["entry_ids"]]
    assert sorted(trained) == sorted(committed)


@pytest.mark.parametrize(
    ("alone", "torch_error", "error"),
    [
        # Pod 0: node 1 never came (torch's own words count the nodes that came, not which).
        (
            0,
            "1/2 clients joined",
            "learner node rank 0: node rank(s) 1 of 2 never joined the rendezvous at "
            "127.0.0.1:{port} within {timeout} s (--rdzv-conf timeout)",
        ),
        # Pod 1: node 0 never answered at its address.
        (
            1,
            "while trying to connect to (127.0.0.1, {port})",
            "learner node rank 1: node rank 0 never answered at 127.0.0.1:{port} "
            "(--master-addr, --master-port) within {timeout} s (--rdzv-conf timeout)",
        ),
    ],
    ids=["node1-never-arrives", "node0-never-arrives"],
)
def test_a_node_that_never_arrives_fails_the_other_at_the_rendezvous_timeout(
    alone: int,
    torch_error: str,
    error: str,
    job: Job,
    tiny_model: Path,
    redis_url: str,
    tmp_path: Path,
) -> None:
    """One agent alone: it fails once the manifest's rendezvous timeout (``LEARNER_RDZV_TIMEOUT``,
    here shortened as an operator would patch it) has passed, torch's error followed by a last line
    naming who is missing; it does not hang, and no rank starts."""
    timeout_s, port, name = 10, free_port(), "alone"
    pod_env = {"REDIS_URL": redis_url, "LEARNER_RDZV_TIMEOUT": str(timeout_s)}
    overrides = base_overrides(tiny_model, tmp_path / name, redis_url, name)
    argv, env = job.agent(alone, port, pod_env, *overrides)
    start = time.monotonic()
    result = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=180,
                            check=False)  # fmt: skip
    took = time.monotonic() - start
    out = result.stdout + result.stderr
    print(f"node {alone} alone: exit {result.returncode} after {took:.1f} s: {out.strip()[-400:]}")
    assert result.returncode != 0, out[-3000:]
    assert timeout_s <= took < timeout_s + 60, (took, out[-3000:])
    assert torch_error.format(port=port) in out, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(error.format(port=port, timeout=timeout_s)), out[-3000:]
    assert not (tmp_path / name / "metrics.jsonl").exists()  # no rank ever started
