"""``dynamo-rl up``: the whole system on one machine, from nothing to a trained model.

What it does, in order (everything lands in the run folder, ``run.dir``):

1. **Data.** Without ``rollout.dataset`` it writes the built-in task (``up.task``) to ``data/``.
2. **Model.** Without ``engine.model``/``learner.model`` it builds a tiny Qwen2 model
   (``dynamo-rl init-model``) and warm-starts it on the task's reference answers
   (``dynamo-rl sft``, the learner's supervised mode) so that RL starts from a model that solves
   some problems but not all. Both steps are skipped when their output already exists.
3. **Services.** Redis (an embedded ``redis-server``/Valkey with AOF in ``redis/`` unless
   ``REDIS_URL`` or ``endpoints.redis_url`` is given), the allocator, the reward service and
   ``up.engines`` embedded engines, each on a free port, each waited for until its health check
   answers. One resolved config (``config.yaml``) is what every child reads.
4. **Held-out accuracy before RL** (``dynamo-rl eval``), unless ``up.eval.prompts=0``.
5. **Training.** The learner under ``torchrun`` (``up.learner_procs`` ranks) and
   ``up.rollout_workers`` rollout workers; a progress line per learner step (step, rollouts used,
   reward, train accuracy, tokens/s, ETA) read from the learner's ``metrics.jsonl``. It ends when the
   learner reaches ``learner.max_steps``.
6. **Held-out accuracy after RL**, on the engines that hold the last pushed weights; the summary
   prints both figures.

Logs per service are in ``logs/``. Ctrl-C (or SIGTERM) stops every child — whole process groups,
SIGTERM then SIGKILL — and so does the end of training: nothing is left behind.

**Supervision** (``up.restart``), like a compose ``restart: always`` policy: once the services are
up, a service that exits — the embedded Redis (same port, same AOF folder), the allocator, the
reward service, an engine (same port), a rollout worker, the learner (until it exits 0 at
``max_steps``) — is restarted after ``backoff_s``, doubled for each earlier restart within
``window_s`` (at most ``backoff_max_s``); the progress display says so. A service that needs more
than ``max_restarts`` restarts within ``window_s`` stops the run with its last log lines. What
survives a restart is the services' business: the learner resumes from its last checkpoint, the
others keep their state in Redis. ``pids.json`` in the run folder names each service's current pid.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamo_rl.cli import parse_config, service_parser
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.procs import ServiceProcess, free_port, grpc_healthy, http_ok, start_redis

__all__ = ["Launcher", "main"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dynamo_rl.cli", *args]


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived: stop everything."""


@dataclass
class Supervised:
    """A long-running service under ``up``'s restart policy."""

    proc: ServiceProcess
    restart: Callable[[], ServiceProcess]
    """Starts the service again (same ports, same folders) and returns its new process."""
    restarts: list[float] = field(default_factory=list)  # monotonic times, pruned to the window
    due: float | None = None  # when the pending restart happens (None: running)


class Launcher:
    """Starts, watches, restarts and stops the local processes of one run."""

    def __init__(self, cfg: ExperimentConfig, out=sys.stdout) -> None:
        self.cfg = cfg
        self.out = out
        self.run_dir = Path(cfg.run.run_dir).resolve()
        self.logs = self.run_dir / "logs"
        self.children: list[ServiceProcess] = []
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            # Several torch processes share the machine's cores: one thread each unless told.
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "TOKENIZERS_PARALLELISM": "false",
        }
        self.overrides: list[str] = []
        self.supervised: dict[str, Supervised] = {}
        self.restart_counts: dict[str, int] = {}
        self.t0 = time.monotonic()

    # -- output ------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.t0
        print(f"[{elapsed:6.1f}s] {text}", file=self.out, flush=True)

    # -- processes -----------------------------------------------------------------------------

    def spawn(self, name: str, argv: Sequence[str]) -> ServiceProcess:
        proc = ServiceProcess(name, argv, self.logs / f"{name}.log", env=self.env).start()
        self.children.append(proc)
        return proc

    def supervise(
        self, name: str, proc: ServiceProcess, restart: Callable[[], ServiceProcess]
    ) -> None:
        self.supervised[name] = Supervised(proc, restart)
        self.write_pids()

    def write_pids(self) -> None:
        pids = {name: s.proc.pid for name, s in self.supervised.items() if s.proc.proc}
        (self.run_dir / "pids.json").write_text(json.dumps(pids, indent=2))

    def check_services(self, finished: Sequence[str] = ()) -> None:
        """One supervision pass: notice exits, restart what is due, stop a crash loop.

        ``finished``: services whose exit with code 0 means done (the learner), not a crash."""
        policy = self.cfg.up.restart
        now = time.monotonic()
        for name, s in self.supervised.items():
            if s.proc.alive():
                continue
            code = s.proc.proc.returncode if s.proc.proc else None
            if name in finished and code == 0:
                continue
            if s.due is None:
                tail = f"last log lines ({s.proc.log_path}):\n{s.proc.log_tail()}"
                if not policy.enabled:
                    raise RuntimeError(f"{name} exited with code {code}; {tail}")
                s.restarts = [t for t in s.restarts if now - t < policy.window_s]
                if len(s.restarts) >= policy.max_restarts:
                    raise RuntimeError(
                        f"{name} keeps crashing: exited with code {code} after {len(s.restarts)} "
                        f"restarts within {policy.window_s:.0f}s; {tail}"
                    )
                delay = min(policy.backoff_s * 2 ** len(s.restarts), policy.backoff_max_s)
                s.due = now + delay
                self.say(f"{name} exited with code {code}: restarting in {delay:.1f}s")
            elif now >= s.due:
                s.proc.stop(grace=5)  # what is left of its process group (torchrun's ranks)
                if s.proc in self.children:
                    self.children.remove(s.proc)
                s.restarts.append(time.monotonic())
                s.due = None
                try:
                    s.proc = s.restart()
                except (RuntimeError, TimeoutError) as e:  # counts as one more crash
                    self.say(f"restart of {name} failed: {str(e).splitlines()[0]}")
                    continue
                count = self.restart_counts[name] = self.restart_counts.get(name, 0) + 1
                self.write_pids()
                self.say(f"restarted {name} (pid {s.proc.pid}, restart {count})")

    def run_step(self, name: str, argv: Sequence[str]) -> None:
        """Run a one-shot child to completion; fail with its log tail if it fails."""
        proc = self.spawn(name, argv)
        assert proc.proc is not None
        while proc.proc.poll() is None:
            self.check_services()
            time.sleep(0.2)
        self.children.remove(proc)
        if proc.proc.returncode != 0:
            raise RuntimeError(
                f"{name} failed with exit code {proc.proc.returncode}; last log lines "
                f"({proc.log_path}):\n{proc.log_tail()}"
            )

    def stop_all(self) -> None:
        for proc in reversed(self.children):
            if proc.alive():
                self.say(f"stopping {proc.name}")
            proc.stop(grace=15)
        self.children.clear()

    def config_args(self) -> list[str]:
        return ["--config", str(self.run_dir / "config.yaml")]

    # -- stages --------------------------------------------------------------------------------

    def prepare_data(self) -> tuple[str, str | None]:
        if self.cfg.rollout.dataset:
            return self.cfg.rollout.dataset, None
        from dynamo_rl.tasks.arith import write_task

        data = self.run_dir / "data"
        if not (data / "train.parquet").exists():
            self.say(f"writing the {self.cfg.up.task} task to {data}")
            up = self.cfg.up
            write_task(data, up.task_train, up.task_test, seed=self.cfg.run.seed)
        return str(data / "train.parquet"), str(data / "test.parquet")

    def prepare_model(self) -> str:
        given = self.cfg.learner.model or self.cfg.engine.model
        if given:
            return given
        up = self.cfg.up
        init = self.run_dir / "model" / "init"
        if not (init / "config.json").exists():
            self.say("building a tiny Qwen2 model")
            tm = up.tiny_model
            self.run_step(
                "init-model",
                _cli("init-model", "--out", str(init), "--hidden-size", str(tm.hidden_size),
                     "--layers", str(tm.num_layers), "--heads", str(tm.num_heads),
                     "--kv-heads", str(tm.num_kv_heads), "--seed", str(self.cfg.run.seed)),
            )  # fmt: skip
        if up.warm_start.steps == 0:
            return str(init)
        sft = self.run_dir / "model" / "sft"
        if not (sft / "config.json").exists():
            ws = up.warm_start
            self.say(f"supervised warm start: {ws.steps} steps")
            self.run_step(
                "sft",
                _cli("sft", "--model", str(init), "--data", str(self.run_dir / "data" / "train.parquet"),
                     "--out", str(sft), "--steps", str(ws.steps), "--lr", str(ws.lr),
                     "--batch-size", str(ws.batch_size), "--tiers", ",".join(ws.tiers),
                     "--seed", str(self.cfg.run.seed),
                     f"learner.optim.grad_clip={ws.grad_clip or 'null'}",
                     f"learner.optim.weight_decay={ws.weight_decay}",
                     # The warm start renders prompts exactly as the rollout worker will.
                     f"learner.data.template={self.cfg.rollout.prompt_template}"),
            )  # fmt: skip
        return str(sft)

    def resolve(self, dataset: str, model: str) -> ExperimentConfig:
        """Pick free ports and write the one config every child reads."""
        cfg = self.cfg
        engine_ports = [free_port() for _ in range(cfg.up.engines)]
        allocator_port, reward_port = free_port(), free_port()
        self.engine_ports = engine_ports
        self.overrides = [
            f"endpoints.allocator_addr=127.0.0.1:{allocator_port}",
            f"endpoints.reward_url=http://127.0.0.1:{reward_port}",
            "endpoints.engine_urls=["
            + ",".join(f"http://127.0.0.1:{p}" for p in engine_ports)
            + "]",
            f"allocator.port={allocator_port}",
            "allocator.metrics_port=0",
            f"reward.port={reward_port}",
            "rollout.metrics_port=0",
            "learner.metrics_port=0",  # two runs on one machine must not collide on 9103
            f"rollout.dataset={dataset}",
            f"rollout.num_workers={cfg.up.rollout_workers}",
            f"engine.model={model}",
            f"learner.model={model}",
            f"run.dir={self.run_dir}",
        ]
        from dynamo_rl.config import apply_overrides

        tree = cfg.model_dump(mode="json", exclude={"endpoints": {"control_token"}})
        apply_overrides(tree, self.overrides)
        resolved = ExperimentConfig.model_validate(tree)
        import yaml

        (self.run_dir / "config.yaml").write_text(
            yaml.safe_dump(resolved.model_dump(mode="json", exclude={"endpoints": {"control_token"}}),
                           sort_keys=False)
        )  # fmt: skip
        return resolved

    def start_services(self, cfg: ExperimentConfig) -> None:
        timeout = cfg.up.health_timeout_s
        external = "REDIS_URL" in os.environ or "redis_url" in self.cfg.endpoints.model_fields_set
        if external:
            self.say(f"using Redis at {cfg.endpoints.redis_url}")
        else:
            proc, url = start_redis(self.run_dir / "redis", appendonly=True, timeout=timeout)
            self.children.append(proc)
            self.env["REDIS_URL"] = url
            self.say(f"embedded Redis at {url}")
            redis_port = int(url.rsplit(":", 1)[1].split("/")[0])

            def restart_redis() -> ServiceProcess:
                # Same port and AOF folder: the stream, statistics and pending entries come back.
                proc, _ = start_redis(
                    self.run_dir / "redis", redis_port, appendonly=True, timeout=timeout
                )
                self.children.append(proc)
                return proc

            self.supervise("redis", proc, restart_redis)
        allocator = self.spawn_supervised("allocator", _cli("allocator", *self.config_args()))
        reward = self.spawn_supervised("reward", _cli("reward", *self.config_args()))
        engines = []
        for i, port in enumerate(self.engine_ports):
            argv = _cli("engine", *self.config_args(), f"engine.port={port}")
            engines.append(self.spawn_supervised(f"engine{i}", argv))
        allocator.wait_ready(grpc_healthy(cfg.endpoints.allocator_addr), timeout)
        self.say(f"allocator ready at {cfg.endpoints.allocator_addr}")
        reward.wait_ready(http_ok(f"{cfg.endpoints.reward_url}/healthz"), timeout)
        self.say(f"reward service ready at {cfg.endpoints.reward_url}")
        for proc, url in zip(engines, cfg.endpoints.engine_urls, strict=True):
            proc.wait_ready(http_ok(f"{url}/health"), timeout)
            self.say(f"{proc.name} ready at {url}")

    def spawn_supervised(
        self, name: str, argv: Sequence[str] | Callable[[], list[str]]
    ) -> ServiceProcess:
        """Spawn a service and put it under the restart policy (``argv`` may be a function: a
        fresh command line per start)."""

        def start() -> ServiceProcess:
            return self.spawn(name, argv() if callable(argv) else argv)

        proc = start()
        self.supervise(name, proc, start)
        return proc

    def evaluate(self, test_data: str | None, label: str) -> dict[str, Any] | None:
        ev = self.cfg.up.eval
        if test_data is None or ev.prompts == 0:
            return None
        out = self.run_dir / f"eval_{label}.json"
        self.say(f"held-out accuracy {label} RL ({ev.prompts} prompts x {ev.samples} samples)")
        self.run_step(
            f"eval-{label}",
            _cli("eval", *self.config_args(), "--data", test_data, "--limit", str(ev.prompts),
                 "--n", str(ev.samples), "--temperature", str(ev.temperature), "--out", str(out)),
        )  # fmt: skip
        result = json.loads(out.read_text())
        self.say(f"held-out accuracy {label} RL: {result['accuracy']:.3f}")
        return result

    def train(self, cfg: ExperimentConfig) -> None:
        procs = cfg.up.learner_procs

        def learner_argv() -> list[str]:  # a fresh rendezvous port for every (re)start
            return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs),
                    "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                    "-m", "dynamo_rl.cli", "learner", *self.config_args()]  # fmt: skip

        self.spawn_supervised("learner", learner_argv)
        workers = [f"rollout{i}" for i in range(cfg.up.rollout_workers)]
        for i, name in enumerate(workers):
            argv = _cli("rollout", *self.config_args(), f"rollout.worker_index={i}",
                        f"rollout.worker_id=worker{i}")  # fmt: skip
            self.spawn_supervised(name, argv)
        progress = Progress(self.run_dir / "metrics.jsonl", cfg.learner.max_steps, self.say)
        while True:
            progress.poll()
            learner = self.supervised["learner"].proc
            if not learner.alive() and learner.proc and learner.proc.returncode == 0:
                break
            self.check_services(finished=("learner",))
            time.sleep(0.5)
        progress.poll()
        for name in [*workers, "learner"]:
            proc = self.supervised.pop(name).proc
            proc.stop(grace=15)
            self.children.remove(proc)
        self.write_pids()

    def run(self) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)

        def interrupt(signum: int, _frame: object) -> None:
            raise Interrupted(signal.Signals(signum).name)

        old = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.say(f"run folder {self.run_dir} (logs in {self.logs})")
            dataset, test_data = self.prepare_data()
            model = self.prepare_model()
            cfg = self.resolve(dataset, model)
            self.start_services(cfg)
            before = self.evaluate(test_data, "before")
            self.train(cfg)
            after = self.evaluate(test_data, "after")
            self.summary(before, after)
            return 0
        except Interrupted as e:
            self.say(f"{e}: shutting down")
            return 130
        except (RuntimeError, TimeoutError) as e:
            self.say(f"error: {e}")
            return 1
        finally:
            # A second Ctrl-C / SIGTERM must not cut the shutdown short and leave orphans.
            for sig in old:
                signal.signal(sig, signal.SIG_IGN)
            self.stop_all()
            for s, handler in old.items():
                signal.signal(s, handler)

    def summary(self, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        result: dict[str, Any] = {
            "run_dir": str(self.run_dir),
            "wall_s": round(time.monotonic() - self.t0, 1),
            "restarts": dict(self.restart_counts),
        }
        if before and after:
            result |= {"accuracy_before": before["accuracy"], "accuracy_after": after["accuracy"]}
            self.say(
                f"held-out accuracy: {before['accuracy']:.3f} -> {after['accuracy']:.3f} "
                f"({100 * (after['accuracy'] - before['accuracy']):+.1f} points)"
            )
        (self.run_dir / "summary.json").write_text(json.dumps(result, indent=2))


class Progress:
    """Turns new lines of the learner's metrics.jsonl into one compact line per step."""

    def __init__(self, path: Path, max_steps: int | None, say) -> None:
        self.path = path
        self.max_steps = max_steps
        self.say = say
        self.offset = 0
        self.rollouts = 0
        self.started: float | None = None
        self.first_step: int | None = None

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            lines = f.readlines()
            self.offset = f.tell()
        for line in lines:
            if not line.endswith("\n"):  # a line still being written: read it next time
                self.offset -= len(line.encode())
                continue
            self.show(json.loads(line))

    def show(self, r: dict[str, Any]) -> None:
        step = int(r.get("step", 0))
        now = time.monotonic()
        if self.started is None:
            self.started, self.first_step = now, step
        self.rollouts += int(r.get("responses", 0))
        parts = [f"step {step}" + (f"/{self.max_steps}" if self.max_steps else "")]
        parts.append(f"rollouts {self.rollouts}")
        for key, label in (("reward_mean", "reward"), ("accuracy_mean", "acc"),
                           ("tokens_per_second", "tok/s")):  # fmt: skip
            if key in r:
                parts.append(f"{label} {r[key]:.3g}")
        done = step - (self.first_step or 0)
        if self.max_steps and done > 0:
            per_step = (now - self.started) / done
            parts.append(f"ETA {per_step * (self.max_steps - step):.0f}s")
        self.say("  ".join(parts))


def main(argv: Sequence[str] | None = None) -> int:
    parser = service_parser("up", __doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--steps", dest="learner.max_steps", metavar="N",
                        help="learner steps to train (learner.max_steps)")  # fmt: skip
    parser.add_argument("--engines", dest="up.engines", metavar="N", help="engine replicas")
    parser.add_argument("--workers", dest="up.rollout_workers", metavar="N",
                        help="rollout workers")  # fmt: skip
    _args, cfg = parse_config(parser, argv)
    if not cfg.learner.max_steps:
        print("dynamo-rl up: learner.max_steps: required (e.g. --steps 50)", file=sys.stderr)
        return 2
    return Launcher(cfg).run()
