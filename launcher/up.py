"""``dynamo-rl up``: the whole system on one machine, from nothing to a trained model.

What it does, in order (everything lands in the run folder, ``run.dir``):

1. **Data.** Without ``rollout.dataset`` it writes the built-in task (``up.task``) to ``data/``;
   with ``rollout.env.name: verifiers`` nothing: the environment's dataset is the training data
   and its ``eval_dataset`` the held-out one (``dynamo-rl eval --data eval``).
2. **Model.** Without ``engine.model``/``learner.model`` it builds a tiny Qwen2 model
   (``dynamo-rl init-model``) and warm-starts it on the task's reference answers
   (``dynamo-rl sft``, the learner's supervised mode) so that RL starts from a model that solves
   some problems but not all; with ``rollout.dataset`` set, on that dataset's reference responses
   (``extra_info.answer``, which ``dynamo-rl data`` writes); with a verifiers environment, on its
   rows' ``answer`` as the reply to their prompt (``dynamo-rl rollout --write-answers``; for a
   multi-turn environment, its first turn), the tiny model then built with a chat template. On
   the built-in tasks, with
   ``up.warm_start.check_rows``, the warm start is checked per tier on train rows it never saw and
   extended while a tier stays below ``min_tier_accuracy``, at most ``max_extensions`` times, then
   the run stops with an error (:mod:`launcher.warm_start`: the recipes and the one loop); its
   steps (loss, steps/s, ETA) and checks show on the console as it trains. Both steps are
   skipped when their output already exists. Before the warm start (or, with a model given,
   before the services), **what it will train on** is printed: ``dynamo-rl rollout
   --check-data`` loads the dataset exactly as the worker will and says how many rows the length
   policy keeps and drops, each data source's scorer, the model's context and ``max_tokens``, and
   which setting to change when more than a tenth is dropped; an unrouted data source stops the
   run here.
3. **Services.** Redis (an embedded ``redis-server``/Valkey with AOF in ``redis/`` unless
   ``REDIS_URL`` or ``endpoints.redis_url`` is given), the allocator, the reward service and
   ``up.engines`` engines of ``engine.kind`` — embedded engines, or vLLM servers from the vLLM
   environment (``dynamo-rl vllm-server``, ``engine.vllm``; SGLang servers are not started here:
   ``up`` refuses ``engine.kind=sglang``) — each on a free port, each waited for until its health
   check answers. With ``up.teacher``, its engines too, serving the teacher model (on-policy
   distillation; ``rollout.teacher`` then names them). One resolved config (``config.yaml``) is what every child reads (its Redis URL
   without the password: the children take the real one from ``REDIS_URL``).
4. **Held-out accuracy before RL** (``dynamo-rl eval``), unless ``up.eval.prompts=0``.
5. **Training.** The learner under ``torchrun`` (``up.learner_procs`` ranks) and
   ``up.rollout_workers`` rollout workers; a progress line per learner step (step, rollouts used,
   reward, train accuracy, tokens/s, ETA; ``no signal`` when every reward was equal) read from
   the learner's ``metrics.jsonl``. It ends when the learner reaches ``learner.max_steps``.
   With ``up.sft_control`` the SFT-continuation control replaces it: supervised training on the
   warm start's demonstrations at RL's steps x batch, loaded into the engines from disk.
6. **Held-out accuracy after RL**, on the engines that hold the last pushed weights; the summary
   prints both figures, and they go to the experiment trackers (``learner.trackers``:
   TensorBoard, wandb) as ``eval/<before|after>/accuracy`` and per data source, at the last step.

Logs per service are in ``logs/``. Throughout, a warning a child writes for the user (the run
folder's ``warnings.jsonl``, :mod:`dynamo_rl.notices`: prompts dropped or truncated, refused by an
engine, steps with no learning signal, unrouted data, an engine left out of a push) is printed once, on one line
naming the service and its log (:mod:`launcher.console`). Ctrl-C (or SIGTERM) stops every child —
whole process groups, SIGTERM then SIGKILL — and so does the end of training: nothing is left
behind.

**Supervision** (``up.restart``) is :class:`launcher.supervisor.Supervisor`'s, like a compose
``restart: always`` policy: once the services are up, a service that exits — the embedded Redis
(same port, same AOF folder), the allocator, the reward service, an engine (same port), a rollout
worker, the learner (until it exits 0 at ``max_steps``) — is restarted after a back-off; a crash
loop stops the run with its last log lines. What survives a restart is the services' business: the
learner resumes from its last checkpoint, the others keep their state in Redis. ``pids.json`` in
the run folder names each service's current pid.

Every service is started from the one table in :mod:`dynamo_rl.service_table` (command line, health
probe, ports). Log lines name Redis only through :func:`dynamo_rl.redis_client.redact_url`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dynamo_rl.cli import parse_config, service_parser
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.notices import FILE
from dynamo_rl.procs import ServiceProcess, free_port, start_redis
from dynamo_rl.redis_client import redact_url
from dynamo_rl.run_layout import init_model, sft_control_model, sft_run_dir, warm_start_model
from dynamo_rl.service_table import SERVICES, cli_argv, engine_service
from launcher.console import NoticeBoard, StepProgress, data_lines
from launcher.supervisor import Interrupted, Supervisor
from launcher.warm_start import WarmStart

__all__ = ["Launcher", "main"]


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
        # The run's warnings, and the warm start's (its sft run has its own folder).
        sft_run = sft_run_dir(warm_start_model(self.run_dir))
        self.board = NoticeBoard([self.run_dir, sft_run], self.say, self.logs)

    def config_args(self) -> list[str]:
        return ["--config", str(self.run_dir / "config.yaml")]

    def run_step(
        self, name: str, argv: list[str], progress: Callable[[], object] | None = None
    ) -> None:
        """A one-shot child to completion (the supervisor's), the run's warnings and ``progress``
        polled meanwhile."""

        def poll() -> None:
            self.board.poll()
            if progress is not None:
                progress()

        self.sup.run_step(name, argv, poll)

    def write_config(self, overrides: list[str]) -> ExperimentConfig:
        """The config with ``overrides`` applied, written as the run's ``config.yaml`` (what every
        child reads; its Redis URL without the password: the children take it from the
        environment)."""
        from dynamo_rl.config import apply_overrides

        tree = self.cfg.model_dump(mode="json", exclude={"endpoints": {"control_token"}})
        apply_overrides(tree, overrides)
        resolved = ExperimentConfig.model_validate(tree)
        import yaml

        written = resolved.model_dump(mode="json", exclude={"endpoints": {"control_token"}})
        written["endpoints"]["redis_url"] = redact_url(resolved.endpoints.redis_url)
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
        return resolved

    # -- stages --------------------------------------------------------------------------------

    def prepare_data(self) -> tuple[str | None, str | None]:
        """The training data and the held-out benchmark ``eval`` reads (``eval``: a verifiers
        environment's eval_dataset; its rows train, no file)."""
        if self.cfg.rollout.env.name == "verifiers":
            return None, "eval"
        if self.cfg.rollout.dataset:
            return self.cfg.rollout.dataset, None
        data = self.run_dir / "data"
        if not (data / "train.parquet").exists():
            self.say(f"writing the {self.cfg.up.task} task to {data}")
            up = self.cfg.up
            if up.task == "when":
                from tasks.when import write_task as write_when

                write_when(data, up.task_train, up.task_test, self.cfg.run.seed, up.task_tiers)
            else:
                if up.task == "products":
                    from tasks.products import write_task
                elif up.task == "longtail":
                    from tasks.longtail import write_task
                else:
                    from tasks.arith import write_task
                write_task(data, up.task_train, up.task_test, seed=self.cfg.run.seed)
        return str(data / "train.parquet"), str(data / "test.parquet")

    def prepare_model(self, dataset: str | None) -> str:
        """The model RL starts from (built and warm-started unless given); on the way, what the
        run will train on is checked and printed (:meth:`check_data`)."""
        given = self.cfg.learner.model or self.cfg.engine.model
        if given:
            self.check_data(dataset, given)
            return given
        up = self.cfg.up
        init = init_model(self.run_dir)
        if not (init / "config.json").exists():
            self.say("building a tiny Qwen2 model")
            tm = up.tiny_model
            self.run_step(
                "init-model",
                cli_argv("init-model", "--out", str(init), "--hidden-size", str(tm.hidden_size),
                         "--layers", str(tm.num_layers), "--heads", str(tm.num_heads),
                         "--kv-heads", str(tm.num_kv_heads), "--seed", str(self.cfg.run.seed),
                         # The environment's chat requests are rendered by the engine.
                         *(["--chat-template"] if dataset is None else [])),
            )  # fmt: skip
        self.check_data(dataset, str(init))
        if up.warm_start.steps == 0:
            return str(init)
        sft = warm_start_model(self.run_dir)
        if not (sft / "config.json").exists():
            WarmStart(self.cfg, self.run_dir, self.run_step, self.say).run(init, sft)
        return str(sft)

    def check_data(self, dataset: str | None, model: str) -> None:
        """Print what the run will train on: the rows the rollout worker keeps and drops, the data
        sources and their scorers, the model's context and ``max_tokens`` (``dynamo-rl rollout
        --check-data``: the worker's own loading, with ``model``'s tokenizer). An unrouted data
        source stops the run here, before any training."""
        out = self.run_dir / "data_check.json"
        self.write_config([*dataset_override(dataset), f"engine.model={model}",
                           f"learner.model={model}", f"run.dir={self.run_dir}"])  # fmt: skip
        self.run_step(
            "data-check", cli_argv("rollout", *self.config_args(), "--check-data", str(out))
        )
        for line in data_lines(json.loads(out.read_text())):
            self.say(line)

    def resolve(self, dataset: str | None, model: str) -> ExperimentConfig:
        """Pick free ports and write the one config every child reads."""
        cfg = self.cfg
        engine_ports = [free_port() for _ in range(cfg.up.engines)]
        allocator_port, reward_port = free_port(), free_port()
        self.engine_ports = engine_ports
        self.teacher_ports = (
            [free_port() for _ in range(cfg.up.teacher.engines)] if cfg.up.teacher else []
        )
        table = SERVICES
        engine = engine_service(cfg.engine.kind)
        teacher = [
            "rollout.teacher.engine_urls=[" + ",".join(engine.address(p) for p in self.teacher_ports) + "]",
            f"rollout.teacher.tokenizer={cfg.up.teacher.model}",
        ] if cfg.up.teacher else []  # fmt: skip
        self.overrides = [
            f"endpoints.allocator_addr={table['allocator'].address(allocator_port)}",
            f"endpoints.reward_url={table['reward'].address(reward_port)}",
            "endpoints.engine_urls=[" + ",".join(engine.address(p) for p in engine_ports) + "]",
            *table["allocator"].port_overrides(allocator_port),
            *table["reward"].port_overrides(reward_port),
            # Metrics on free ports: two runs on one machine must not collide on the defaults.
            *table["rollout"].port_overrides(0),
            *table["learner"].port_overrides(0),
            *dataset_override(dataset),
            f"rollout.num_workers={cfg.up.rollout_workers}",
            f"engine.model={model}",
            f"learner.model={model}",
            f"run.dir={self.run_dir}",
            *teacher,
        ]
        resolved = self.write_config(self.overrides)
        # A Redis password reaches the children through the environment, never the run folder.
        self.env["REDIS_URL"] = resolved.endpoints.redis_url
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
        if cfg.up.teacher:  # its own model, out of the Redis registry: no push, no rollouts
            for i, port in enumerate(self.teacher_ports):
                argv = engine.argv(*self.config_args(), *engine.port_overrides(port),
                                   f"engine.model={cfg.up.teacher.model}",
                                   "engine.register_in_redis=false")  # fmt: skip
                engines.append(sup.spawn_supervised(f"teacher{i}", argv))
        urls = [
            *cfg.endpoints.engine_urls,
            *(cfg.rollout.teacher.engine_urls if cfg.up.teacher else []),
        ]
        waits = [
            ("allocator", allocator, cfg.endpoints.allocator_addr),
            ("reward", reward, cfg.endpoints.reward_url),
            *((engine.name, proc, url) for proc, url in zip(engines, urls, strict=True)),
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
        what = "the SFT control" if self.cfg.up.sft_control else "RL"
        self.say(f"held-out accuracy {label} {what} ({ev.prompts} prompts x {ev.samples} samples)")
        self.run_step(
            f"eval-{label}",
            cli_argv("eval", *self.config_args(), "--data", test_data, "--limit", str(ev.prompts),
                     "--n", str(ev.samples), "--temperature", str(ev.temperature), "--out", str(out)),
        )  # fmt: skip
        result = json.loads(out.read_text())
        self.say(f"held-out accuracy {label} {what}: {result['accuracy']:.3f}")
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
        progress = StepProgress(self.run_dir / "metrics.jsonl", cfg.learner.max_steps, self.say)
        while True:
            progress.poll()
            self.board.poll()
            learner = sup.supervised["learner"].proc
            if not learner.alive() and learner.proc and learner.proc.returncode == 0:
                break
            sup.check_services(finished=("learner",))
            time.sleep(0.5)
        progress.poll()
        self.board.poll()
        for name in [*workers, "learner"]:
            sup.release(name)

    def sft_control(self, cfg: ExperimentConfig) -> None:
        """``up.sft_control``: supervised training on the warm start's demonstrations for RL's
        compute instead of RL (:meth:`launcher.warm_start.WarmStart.control`), the result loaded
        into every engine (its ``/update_weights_from_disk``, weight version 1)."""
        from dynamo_rl.contracts.weight_control import send, weight_protocol

        out = sft_control_model(self.run_dir)
        if not (out / "config.json").exists():
            warm = WarmStart(cfg, self.run_dir, self.run_step, self.say)
            warm.control(warm_start_model(self.run_dir), out)
        protocol = weight_protocol(cfg.rollout.weight_api, pause_mode=cfg.rollout.vllm_pause_mode)
        token = self.cfg.endpoints.control_token  # the resolved config leaves it out
        headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}
        for url in cfg.endpoints.engine_urls:
            send(protocol, url, protocol.update_from_disk(str(out), 1), headers=headers)
        self.say(f"SFT control loaded into {len(cfg.endpoints.engine_urls)} engine(s)")

    def run(self) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            with self.sup.signals():
                self.say(f"run folder {self.run_dir} (logs in {self.logs})")
                dataset, test_data = self.prepare_data()
                model = self.prepare_model(dataset)
                cfg = self.resolve(dataset, model)
                self.start_services(cfg)
                before = self.evaluate(test_data, "before")
                if cfg.up.sft_control:
                    self.sft_control(cfg)
                else:
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
        self.board.poll()
        if self.board.shown:
            result["warnings"] = len(self.board.shown)
            self.say(f"{len(self.board.shown)} warning(s) during the run, each shown above once "
                     f"(all in {self.run_dir / FILE})")  # fmt: skip
        if before and after:
            result |= {"accuracy_before": before["accuracy"], "accuracy_after": after["accuracy"]}
            self.say(
                f"held-out accuracy: {before['accuracy']:.3f} -> {after['accuracy']:.3f} "
                f"({100 * (after['accuracy'] - before['accuracy']):+.1f} points)"
            )
        (self.run_dir / "summary.json").write_text(json.dumps(result, indent=2))


def dataset_override(dataset: str | None) -> list[str]:
    """``rollout.dataset`` as an override; none for a verifiers environment (its rows)."""
    return [] if dataset is None else [f"rollout.dataset={dataset}"]


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
    if cfg.rollout.env.name == "verifiers" and cfg.up.sft_control:
        print("dynamo-rl up: up.sft_control must be false with rollout.env.name 'verifiers' (the "
              "control trains on a built-in task's demonstrations)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        engine_service(cfg.engine.kind)
    except ValueError as e:
        print(f"dynamo-rl up: {e}", file=sys.stderr)
        return 2
    return Launcher(cfg).run()
