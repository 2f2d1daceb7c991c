"""``dynamo-rl up``: the whole system on one machine, from nothing to a trained model.

What it does, in order (everything lands in the run folder, ``run.dir``):

1. **Data.** Without ``rollout.dataset`` it writes the built-in task (``up.task``) to ``data/``.
2. **Model.** Without ``engine.model``/``learner.model`` it builds a tiny Qwen2 model
   (``dynamo-rl init-model``) and warm-starts it on the task's reference answers
   (``dynamo-rl sft``, the learner's supervised mode) so that RL starts from a model that solves
   some problems but not all; with ``rollout.dataset`` set, on that dataset's reference responses
   (``extra_info.answer``, which ``dynamo-rl data`` writes). On the built-in task, with
   ``up.warm_start.check_rows``, that many train rows per tier are held out of the warm start and
   checked after it (greedy accuracy per tier, the sft run's ``eval_exact/<tier>``; with
   ``target_exact`` also every ``check_every`` steps, the warm start stopping at the first check
   whose exact match over all of them reaches it, ``steps`` then being the most); a tier below
   ``min_tier_accuracy`` extends the same run by ``extend_steps`` with half of each batch from
   the tiers not learned, at most ``max_extensions`` times, then the run stops with an error
   naming them. On the ``products`` task (the agent recipe) the warm start sees the first
   ``up.warm_start.rows`` questions: their direct answers, or with ``demos: tool_calls`` two-turn
   demonstrations that call the calculator of the ``rollout.env`` tools environment
   (:func:`dynamo_rl.tasks.products.tool_demos`). Both steps are skipped when their output
   already exists.
3. **Services.** Redis (an embedded ``redis-server``/Valkey with AOF in ``redis/`` unless
   ``REDIS_URL`` or ``endpoints.redis_url`` is given), the allocator, the reward service and
   ``up.engines`` engines of ``engine.kind`` — embedded engines, or vLLM servers from the vLLM
   environment (``dynamo-rl vllm-server``, ``engine.vllm``; SGLang servers are not started here:
   ``up`` refuses ``engine.kind=sglang``) — each on a free port, each waited for until its health
   check answers. One resolved config (``config.yaml``) is what every child reads (its Redis URL
   without the password: the children take the real one from ``REDIS_URL``).
4. **Held-out accuracy before RL** (``dynamo-rl eval``), unless ``up.eval.prompts=0``.
5. **Training.** The learner under ``torchrun`` (``up.learner_procs`` ranks) and
   ``up.rollout_workers`` rollout workers; a progress line per learner step (step, rollouts used,
   reward, train accuracy, tokens/s, ETA) read from the learner's ``metrics.jsonl``. It ends when the
   learner reaches ``learner.max_steps``.
6. **Held-out accuracy after RL**, on the engines that hold the last pushed weights; the summary
   prints both figures, and they go to the experiment trackers (``learner.trackers``:
   TensorBoard, wandb) as ``eval/<before|after>/accuracy`` and per data source, at the last step.

Logs per service are in ``logs/``. Ctrl-C (or SIGTERM) stops every child — whole process groups,
SIGTERM then SIGKILL — and so does the end of training: nothing is left behind.

**Supervision** (``up.restart``) is :class:`dynamo_rl.supervisor.Supervisor`'s, like a compose
``restart: always`` policy: once the services are up, a service that exits — the embedded Redis
(same port, same AOF folder), the allocator, the reward service, an engine (same port), a rollout
worker, the learner (until it exits 0 at ``max_steps``) — is restarted after a back-off; a crash
loop stops the run with its last log lines. What survives a restart is the services' business: the
learner resumes from its last checkpoint, the others keep their state in Redis. ``pids.json`` in
the run folder names each service's current pid.

Every service is started from the one table in :mod:`dynamo_rl.services` (command line, health
probe, ports). Log lines name Redis only through :func:`dynamo_rl.redis_client.redact_url`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynamo_rl.cli import parse_config, service_parser
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.procs import ServiceProcess, free_port, start_redis
from dynamo_rl.redis_client import redact_url
from dynamo_rl.services import SERVICES, cli_argv, engine_service
from dynamo_rl.supervisor import Interrupted, Supervisor

__all__ = ["Launcher", "main"]

# Share of each batch an extension of the warm start spends on the tiers not yet learned.
FOCUS_SHARE = 0.5


class Launcher:
    """``up``'s recipe: data, model, services, evaluations and training, on a :class:`Supervisor`."""

    def __init__(self, cfg: ExperimentConfig, out=sys.stdout) -> None:
        self.cfg = cfg
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            # Several torch processes share the machine's cores: one thread each unless told.
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "TOKENIZERS_PARALLELISM": "false",
        }
        self.sup = Supervisor(Path(cfg.run.run_dir), cfg.up.restart, env=env, out=out)
        self.run_dir = self.sup.run_dir
        self.logs = self.sup.logs
        self.env = env
        self.say = self.sup.say
        self.overrides: list[str] = []

    def config_args(self) -> list[str]:
        return ["--config", str(self.run_dir / "config.yaml")]

    # -- stages --------------------------------------------------------------------------------

    def prepare_data(self) -> tuple[str, str | None]:
        if self.cfg.rollout.dataset:
            return self.cfg.rollout.dataset, None
        if self.cfg.up.task == "products":
            from dynamo_rl.tasks.products import write_task
        else:
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
            self.sup.run_step(
                "init-model",
                cli_argv("init-model", "--out", str(init), "--hidden-size", str(tm.hidden_size),
                         "--layers", str(tm.num_layers), "--heads", str(tm.num_heads),
                         "--kv-heads", str(tm.num_kv_heads), "--seed", str(self.cfg.run.seed)),
            )  # fmt: skip
        if up.warm_start.steps == 0:
            return str(init)
        sft = self.run_dir / "model" / "sft"
        if not (sft / "config.json").exists():
            # The built-in task's tiers, or the user's dataset as it is: its rows' reference
            # responses (extra_info.answer, as `dynamo-rl data` writes them) are the targets.
            if self.cfg.rollout.dataset:
                self.warm_start(init, sft, self.cfg.rollout.dataset, up.warm_start.steps)
            elif up.task == "products":
                self.warm_start_products(init, sft)
            else:
                self.warm_start_task(init, sft)
        return str(sft)

    def warm_start(
        self,
        init: Path,
        sft: Path,
        data: str,
        steps: int,
        options: Sequence[str] = (),
        overrides: Sequence[str] = (),
        label: str = "",
    ) -> None:
        """One ``dynamo-rl sft`` call; a later call with more steps resumes the same run."""
        ws = self.cfg.up.warm_start
        self.say(f"supervised warm start{label}: {steps} steps on {data}")
        self.sup.run_step(
            "sft",
            cli_argv("sft", "--model", str(init), "--data", data,
                     "--out", str(sft), "--steps", str(steps), "--lr", str(ws.lr),
                     "--batch-size", str(ws.batch_size), *options,
                     "--seed", str(self.cfg.run.seed),
                     f"learner.optim.grad_clip={ws.grad_clip or 'null'}",
                     f"learner.optim.weight_decay={ws.weight_decay}",
                     # The warm start renders prompts exactly as the rollout worker will.
                     f"learner.data.template={self.cfg.rollout.prompt_template}", *overrides),
        )  # fmt: skip

    def warm_start_products(self, init: Path, sft: Path) -> None:
        """The ``products`` task's warm start on its first ``up.warm_start.rows`` train questions:
        their direct answers, or (``demos: tool_calls``) two-turn demonstrations that call the
        calculator of the ``rollout.env`` tools environment and copy its output."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        ws = self.cfg.up.warm_start
        data = self.run_dir / "data"
        every = pq.read_table(data / "train.parquet").to_pylist()
        rows = every[: ws.rows] if ws.rows else every
        # The check: train questions the warm start never sees (after its rows).
        check = every[len(rows) : len(rows) + ws.check_rows]
        if ws.check_rows and not check:
            raise RuntimeError(
                "up.warm_start.check_rows: no train questions left after up.warm_start.rows to "
                "check the warm start on; lower up.warm_start.rows or raise up.task_train"
            )
        if ws.demos == "tool_calls":
            from dynamo_rl.tasks.products import tool_demos

            env = self.cfg.rollout.env
            if env.name != "tools" or self.cfg.rollout.prompt_template != "raw":
                raise RuntimeError(
                    "up.warm_start.demos=tool_calls: needs rollout.env.name=tools (with the "
                    "calculator tool) and rollout.prompt_template=raw"
                )
            rows, check = tool_demos(rows, env), tool_demos(check, env)
        path = data / f"warm_start_{ws.demos}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        if not check:
            self.warm_start(init, sft, str(path), ws.steps)
            return
        pq.write_table(pa.Table.from_pylist(check), data / "warm_check.parquet")
        checked = [f"learner.data.eval_path={data / 'warm_check.parquet'}",
                   "learner.data.group_key=extra_info.tier"]  # fmt: skip
        tiers = sorted({r["extra_info"]["tier"] for r in check})
        steps = self.checked_warm_start(init, sft, str(path), checked)
        for extension in range(ws.max_extensions + 1):
            accuracy = self.tier_accuracy(sft, tiers)
            shown = ", ".join(f"{t} {a:.2f}" for t, a in accuracy.items())
            self.say(f"warm start checked (greedy exact match on {len(check)} rows of unseen "
                     f"train questions): {shown}")  # fmt: skip
            if min(accuracy.values()) >= ws.min_tier_accuracy:
                return
            if extension == ws.max_extensions:
                raise RuntimeError(
                    f"up.warm_start: still below up.warm_start.min_tier_accuracy "
                    f"({ws.min_tier_accuracy}) after {steps} steps and {ws.max_extensions} "
                    "extensions (up.warm_start.max_extensions); raise up.warm_start.steps or lr"
                )
            steps += ws.extend_steps
            label = f" extended (below {ws.min_tier_accuracy})"
            self.warm_start(init, sft, str(path), steps, (), checked, label)

    def warm_start_task(self, init: Path, sft: Path) -> None:
        """The built-in task's warm start, checked: greedy accuracy per tier on held-out train
        rows after it, and ``extend_steps`` more steps weighted toward the tiers below
        ``min_tier_accuracy`` until every tier is learned (or an error after
        ``max_extensions``)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from dynamo_rl.tasks.arith import check_split, focus_mix

        ws = self.cfg.up.warm_start
        data = self.run_dir / "data"
        rows = pq.read_table(data / "train.parquet").to_pylist()
        present = {r["extra_info"]["tier"] for r in rows}
        missing = [t for t in ws.tiers if t not in present]
        if missing:
            raise RuntimeError(
                f"up.warm_start.tiers: no train rows of {', '.join(missing)} (the task's tiers: "
                f"{', '.join(sorted(present))})"
            )
        if not ws.check_rows:
            tiers = ["--tiers", ",".join(ws.tiers)]
            self.warm_start(init, sft, str(data / "train.parquet"), ws.steps, tiers)
            return
        train, check = check_split(rows, ws.tiers, ws.check_rows)
        checked_tiers = [t for t in ws.tiers if any(r["extra_info"]["tier"] == t for r in check)]
        paths = {"warm_start": train, "warm_check": check}
        for name, part in paths.items():
            pq.write_table(pa.Table.from_pylist(part), data / f"{name}.parquet")
        checked = [f"learner.data.eval_path={data / 'warm_check.parquet'}",
                   "learner.data.group_key=extra_info.tier"]  # fmt: skip
        steps = self.checked_warm_start(init, sft, str(data / "warm_start.parquet"), checked)
        for extension in range(ws.max_extensions + 1):
            accuracy = self.tier_accuracy(sft, checked_tiers)
            shown = ", ".join(f"{t} {a:.2f}" for t, a in accuracy.items())
            self.say(f"warm start checked (greedy accuracy on {len(check)} held-out train rows): "
                     f"{shown}")  # fmt: skip
            weak = [t for t, a in accuracy.items() if a < ws.min_tier_accuracy]
            if not weak:
                return
            if extension == ws.max_extensions:
                raise RuntimeError(
                    f"up.warm_start: tiers {', '.join(weak)} still below "
                    f"up.warm_start.min_tier_accuracy ({ws.min_tier_accuracy}) after {steps} "
                    f"steps and {ws.max_extensions} extensions (up.warm_start.max_extensions); "
                    "raise up.warm_start.steps or lr, or leave those tiers out of "
                    "up.warm_start.tiers"
                )
            mix = focus_mix(train, weak, FOCUS_SHARE, seed=self.cfg.run.seed + extension)
            path = data / f"warm_focus{extension + 1}.parquet"
            pq.write_table(pa.Table.from_pylist(mix), path)
            steps += ws.extend_steps
            label = f" extended for {', '.join(weak)} (below {ws.min_tier_accuracy})"
            self.warm_start(init, sft, str(path), steps, (), checked, label)

    def checked_warm_start(self, init: Path, sft: Path, data: str, checked: list[str]) -> int:
        """The first warm-start call of a checked warm start: ``up.warm_start.steps``, or up to
        them until the check reaches ``target_exact``. Returns the steps it trained."""
        ws = self.cfg.up.warm_start
        if ws.target_exact is None:
            self.warm_start(init, sft, data, ws.steps, (), checked)
            return ws.steps
        target = [f"learner.data.stop_exact={ws.target_exact}",
                  f"learner.data.eval_every={ws.check_every}"]  # fmt: skip
        label = f" until the check's exact match reaches {ws.target_exact}, at most"
        self.warm_start(init, sft, data, ws.steps, (), [*checked, *target], label)
        last = self.last_check(sft)
        self.say(f"warm start: {last['step']} steps, exact match "
                 f"{last['eval_exact']:.3f} on the check (target {ws.target_exact})")  # fmt: skip
        return int(last["step"])

    @staticmethod
    def last_check(sft: Path) -> dict:
        """The sft run's last evaluation record."""
        log = sft.with_name(sft.name + ".run") / "metrics.jsonl"
        records = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
        return [r for r in records if r.get("kind") == "eval"][-1]

    @staticmethod
    def tier_accuracy(sft: Path, tiers: list[str]) -> dict[str, float]:
        """Per-tier greedy accuracy of the sft run's last evaluation (its ``eval_exact/<tier>``)."""
        last = Launcher.last_check(sft)
        return {t: float(last.get(f"eval_exact/{t}", 0.0)) for t in tiers}

    def resolve(self, dataset: str, model: str) -> ExperimentConfig:
        """Pick free ports and write the one config every child reads."""
        cfg = self.cfg
        engine_ports = [free_port() for _ in range(cfg.up.engines)]
        allocator_port, reward_port = free_port(), free_port()
        self.engine_ports = engine_ports
        table = SERVICES
        engine = engine_service(cfg.engine.kind)
        self.overrides = [
            f"endpoints.allocator_addr={table['allocator'].address(allocator_port)}",
            f"endpoints.reward_url={table['reward'].address(reward_port)}",
            "endpoints.engine_urls=[" + ",".join(engine.address(p) for p in engine_ports) + "]",
            *table["allocator"].port_overrides(allocator_port),
            *table["reward"].port_overrides(reward_port),
            # Metrics on free ports: two runs on one machine must not collide on the defaults.
            *table["rollout"].port_overrides(0),
            *table["learner"].port_overrides(0),
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

        written = resolved.model_dump(mode="json", exclude={"endpoints": {"control_token"}})
        # A Redis password reaches the children through the environment, never the run folder.
        self.env["REDIS_URL"] = resolved.endpoints.redis_url
        written["endpoints"]["redis_url"] = redact_url(resolved.endpoints.redis_url)
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
        return resolved

    def start_services(self, cfg: ExperimentConfig) -> None:
        timeout = cfg.up.health_timeout_s
        sup = self.sup
        external = "REDIS_URL" in os.environ or "redis_url" in self.cfg.endpoints.model_fields_set
        if external:
            self.say(f"using Redis at {redact_url(cfg.endpoints.redis_url)}")
        else:
            proc, url = start_redis(self.run_dir / "redis", appendonly=True, timeout=timeout)
            sup.adopt(proc)
            self.env["REDIS_URL"] = url
            self.say(f"embedded Redis at {redact_url(url)}")
            # config.yaml names it too (no password: it has none), so that `dynamo-rl dashboard
            # --config <run>/config.yaml` finds the stream while the run goes on.
            import yaml

            written = yaml.safe_load((self.run_dir / "config.yaml").read_text())
            written["endpoints"]["redis_url"] = redact_url(url)
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
            redis_port = int(url.rsplit(":", 1)[1].split("/")[0])

            def restart_redis() -> ServiceProcess:
                # Same port and AOF folder: the stream, statistics and pending entries come back.
                proc, _ = start_redis(
                    self.run_dir / "redis", redis_port, appendonly=True, timeout=timeout
                )
                return sup.adopt(proc)

            sup.supervise("redis", proc, restart_redis)
        table = SERVICES
        allocator = sup.spawn_supervised("allocator", table["allocator"].argv(*self.config_args()))
        reward = sup.spawn_supervised("reward", table["reward"].argv(*self.config_args()))
        engine = engine_service(cfg.engine.kind)
        engines = []
        for i, port in enumerate(self.engine_ports):
            argv = engine.argv(*self.config_args(), *engine.port_overrides(port))
            engines.append(sup.spawn_supervised(f"engine{i}", argv))
        waits = [
            ("allocator", allocator, cfg.endpoints.allocator_addr),
            ("reward", reward, cfg.endpoints.reward_url),
            *((engine.name, proc, url) for proc, url in zip(engines, cfg.endpoints.engine_urls,
                                                            strict=True)),
        ]  # fmt: skip
        for kind, proc, address in waits:
            table[kind].wait_ready(proc, address, timeout)
            what = {"allocator": "allocator", "reward": "reward service"}.get(kind, proc.name)
            self.say(f"{what} ready at {address}")

    def evaluate(self, test_data: str | None, label: str) -> dict[str, Any] | None:
        ev = self.cfg.up.eval
        if test_data is None or ev.prompts == 0:
            return None
        out = self.run_dir / f"eval_{label}.json"
        self.say(f"held-out accuracy {label} RL ({ev.prompts} prompts x {ev.samples} samples)")
        self.sup.run_step(
            f"eval-{label}",
            cli_argv("eval", *self.config_args(), "--data", test_data, "--limit", str(ev.prompts),
                     "--n", str(ev.samples), "--temperature", str(ev.temperature), "--out", str(out)),
        )  # fmt: skip
        result = json.loads(out.read_text())
        self.say(f"held-out accuracy {label} RL: {result['accuracy']:.3f}")
        return result

    def train(self, cfg: ExperimentConfig) -> None:
        sup = self.sup
        procs = cfg.up.learner_procs
        # A function: a fresh rendezvous port for every (re)start.
        sup.spawn_supervised(
            "learner", lambda: SERVICES["learner"].argv(*self.config_args(), nproc=procs)
        )
        workers = [f"rollout{i}" for i in range(cfg.up.rollout_workers)]
        for i, name in enumerate(workers):
            argv = SERVICES["rollout"].argv(*self.config_args(), f"rollout.worker_index={i}",
                                            f"rollout.worker_id=worker{i}")  # fmt: skip
            sup.spawn_supervised(name, argv)
        progress = Progress(self.run_dir / "metrics.jsonl", cfg.learner.max_steps, self.say)
        while True:
            progress.poll()
            learner = sup.supervised["learner"].proc
            if not learner.alive() and learner.proc and learner.proc.returncode == 0:
                break
            sup.check_services(finished=("learner",))
            time.sleep(0.5)
        progress.poll()
        for name in [*workers, "learner"]:
            sup.release(name)

    def run(self) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            with self.sup.signals():
                self.say(f"run folder {self.run_dir} (logs in {self.logs})")
                dataset, test_data = self.prepare_data()
                model = self.prepare_model()
                cfg = self.resolve(dataset, model)
                self.start_services(cfg)
                before = self.evaluate(test_data, "before")
                self.train(cfg)
                after = self.evaluate(test_data, "after")
                self.track(cfg, before, after)
                self.summary(before, after)
                return 0
        except Interrupted as e:
            self.say(f"{e}: shutting down")
            return 130
        except (RuntimeError, TimeoutError) as e:
            self.say(f"error: {e}")
            return 1

    def track(
        self, cfg: ExperimentConfig, before: dict[str, Any] | None, after: dict[str, Any] | None
    ) -> None:
        """The evaluations into the learner's trackers (``learner.trackers``), same run, at the
        last step."""
        if not cfg.learner.trackers or not (before or after):
            return
        from dynamo_rl.trackers import Trackers, eval_metrics

        config = cfg.model_dump(mode="json", exclude={"endpoints": {"control_token"}})
        config["endpoints"].pop("redis_url", None)
        values: dict[str, float] = {}
        for label, result in (("before", before), ("after", after)):
            if result:
                values |= eval_metrics(label, result)
        trackers = Trackers(
            cfg.learner.trackers, self.run_dir, cfg.run.name, config, cfg.learner.wandb
        )
        try:
            trackers.log(values, cfg.learner.max_steps or 0)
        finally:
            trackers.close()
        self.say(f"evaluations logged to {', '.join(cfg.learner.trackers)}")

    def summary(self, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        result: dict[str, Any] = {
            "run_dir": str(self.run_dir),
            "wall_s": round(time.monotonic() - self.sup.t0, 1),
            "restarts": dict(self.sup.restart_counts),
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
    parser.add_argument("--trackers", dest="learner.trackers", metavar="A,B",
                        help="experiment trackers: tensorboard, wandb (learner.trackers)")  # fmt: skip
    _args, cfg = parse_config(parser, argv)
    from dynamo_rl.trackers import missing_packages

    if error := missing_packages(cfg.learner.trackers):
        print(f"dynamo-rl up: {error}", file=sys.stderr)
        return 2
    if not cfg.learner.max_steps:
        print("dynamo-rl up: learner.max_steps: required (e.g. --steps 50)", file=sys.stderr)
        return 2
    try:
        engine_service(cfg.engine.kind)
    except ValueError as e:
        print(f"dynamo-rl up: {e}", file=sys.stderr)
        return 2
    return Launcher(cfg).run()
