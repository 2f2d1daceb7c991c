"""Kill an engine replica of a real ``dynamo-rl up`` run (2 engines): training goes on.

``kill -9`` one engine: the workers' pool benches it and sends every request to the other; ``up``
(frozen until a worker has met the dead engine) restarts it on its port and the workers use it
again. The learner's push leaves the dead engine out within seconds (one push group per engine,
see ``tests/learner/test_push_dead_engine.py``) and the next push after the restart forms a new
group with it.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from dynamo_rl import keys
from tests.reliability.helpers import UpRun, frozen, process_tree

STEPS = 30


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_a_killed_engine_replica_is_routed_around_and_restarted(tmp_path: Path, redis_url: str):
    run = UpRun(
        tmp_path / "run",
        "enginefault",
        STEPS,
        "up.engines=2",
        "up.restart.backoff_s=1.0",
        # Bounds a push to an engine that hangs (a dead one is left out at once).
        "learner.push.timeout_s=15",
        redis_url=redis_url,
    )
    run_dir = run.run_dir
    try:
        run.wait("step 2", lambda: len(run.records()) >= 2)
        url = yaml.safe_load((run_dir / "config.yaml").read_text())["endpoints"]["engine_urls"][1]
        # ``up`` is frozen while the engine is down, so it is restarted only once a worker has
        # met it dead: a worker waiting for room (or a push waiting out its timeout) could
        # otherwise miss the whole outage, and there would be nothing to route around.
        with run.supervisor_frozen():
            os.kill(run.pid("engine1"), signal.SIGKILL)
            steps_at_kill = len(run.records())
            run.wait("a worker to meet the dead engine",
                     lambda: f"engine {url} failed" in run.log("rollout0"))  # fmt: skip
            # The learner leaves the dead engine out of its pushes: steps go on while it is down.
            run.wait("a step with the engine down", lambda: len(run.records()) > steps_at_kill)
            learner = process_tree(run.pid("learner"))
        # The learner held until the engine is back, so that steps remain to be run on it (on an
        # idle machine the learner can otherwise reach max_steps before the restart is ready).
        with frozen(learner):
            run.wait_restart("engine1")
            run.wait("the restarted engine to answer", lambda: _healthy(url))
        run.wait("the workers to use the restarted engine",
                 lambda: f"POST {url}/v1/completions"
                 in run.log("rollout0").split(f"engine {url} failed", 1)[1])  # fmt: skip
        run.wait("the run to finish", lambda: run.proc.poll() is not None)
    finally:
        run.stop()
    text = run.output()
    assert run.proc.returncode == 0, text[-4000:]
    assert json.loads((run_dir / "summary.json").read_text())["restarts"] == {"engine1": 1}
    worker_log = (run_dir / "logs" / "rollout0.log").read_text()
    # The pool benched the killed replica (the other one kept serving: training went on) ...
    assert f"engine {url} failed" in worker_log
    after_failure = worker_log.split(f"engine {url} failed", 1)[1]
    # ... and sent requests to it again once it was back.
    assert f"POST {url}/v1/completions" in after_failure, worker_log[-3000:]


@pytest.mark.slow
def test_a_restarted_single_engine_gets_the_weights_again(tmp_path: Path, redis_url: str):
    """One engine (compose's stack): killed mid-training and restarted on the weights it was
    started with. A worker that meets it at its gate waits for an engine within
    ``rollout.max_staleness`` of the learner, and the learner, out of groups, has no step to push
    after: it must push to the lagging engine while it waits (``learner/stream_source.py``'s ``CATCH_UP_S``),
    or training stalls for good. (A worker with a batch in flight finishes it on the restarted
    engine, and the step on it pushes: so the worker is killed too, and restarts at its gate.)"""
    name = "oneengine"
    run = UpRun(tmp_path / "run", name, 12, "up.restart.backoff_s=1.0",
                "learner.push.timeout_s=15", "rollout.max_staleness=1",
                redis_url=redis_url)  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    stream, group = keys.trajectory_stream(name), keys.learner_group(name)

    def learner_waits_for_groups() -> bool:
        # Every entry read, and every one read is in a logged step (so the push after that step,
        # to the dead engine, is over): the learner holds nothing and waits for groups.
        last = client.xrevrange(stream, count=1)
        info = {g["name"].decode(): g for g in client.xinfo_groups(stream)}[group]
        logged = sum(r["groups"] + r["groups_skipped"] for r in run.records())
        return (bool(last) and info["last-delivered-id"] == last[0][0]
                and info["entries-read"] == logged)  # fmt: skip

    try:
        run.wait("step 2 (weights pushed)", lambda: len(run.records()) >= 2, timeout=600)
        # The engine stays down until the learner has trained on every group the workers wrote:
        # it then waits for groups with none coming, and the restarted engine is behind it.
        with run.supervisor_frozen():
            os.kill(run.pid("engine0"), signal.SIGKILL)
            os.kill(run.pid("rollout0"), signal.SIGKILL)
            run.wait("the learner to wait for groups", learner_waits_for_groups)
            version = int(client.get(keys.weight_version_key(name)) or 0)
        assert version >= 2
        run.wait_restart("engine0")
        run.wait_restart("rollout0")
        run.wait("training to reach max_steps after the restart",
                 lambda: run.proc.poll() is not None, timeout=300)  # fmt: skip
    finally:
        run.stop()
    assert run.proc.returncode == 0, run.output()[-4000:]
    assert len(run.records()) == 12
    assert "pushing it again" in run.log("learner")
