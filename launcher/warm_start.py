"""``up``'s supervised warm start: the fresh tiny model fine-tuned (``dynamo-rl sft``) on reference
answers before RL, so that RL starts from a model that solves some problems but not all.

Three recipes feed one loop:

- **A user's dataset** (``rollout.dataset``): one sft run of ``up.warm_start.steps`` on its rows'
  reference responses (``extra_info.answer``, as ``dynamo-rl data`` writes them). Not checked.
- **A verifiers environment** (``rollout.env.name: verifiers``): the same, on the environment's
  rows with their ``answer`` as the reply (:meth:`WarmStart.verifiers_answers`; a multi-turn
  environment's first turn only). Not checked.
- **The built-in arithmetic task** (``up.task: arith``): the train rows of ``up.warm_start.tiers``.
  With ``check_rows``, that many train rows per tier are held out and checked; an extension trains
  on a mix that gives the tiers not yet learned ``FOCUS_SHARE`` of each batch.
- **The products and when tasks** (the agent recipes): the first ``up.warm_start.rows`` train
  questions, as direct answers or (``demos: tool_calls``) demonstrations that call the tool of
  the ``rollout.env`` environment, or (``half_tool_calls``) those on a random half and the
  direct answers on the others (:func:`tasks.when.demos`).
  It is checked on the next ``check_rows`` train questions, per tier; an extension trains longer
  on the same rows. The same rows feed the SFT-continuation control (:meth:`WarmStart.control`,
  ``up.sft_control``).

Each sft call's steps (step, loss, steps/s, ETA) and checks (exact match) reach the console as
it trains (:class:`launcher.console.WarmStartProgress`, reading the sft run's step log).

The loop (:meth:`WarmStart.checked`): train ``steps`` (or, with ``target_exact``, until the
check's exact match reaches it, ``steps`` then being the most), read the per-tier greedy accuracy
of the sft run's last evaluation (``eval_exact/<tier>``), and stop when every tier reaches
``min_tier_accuracy``; otherwise resume the same sft run for ``extend_steps`` more on the recipe's
extension data, at most ``max_extensions`` times, then stop the run with an error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamo_rl.config import ExperimentConfig
from dynamo_rl.jsonl import read_records
from dynamo_rl.run_layout import sft_run_dir
from dynamo_rl.service_table import cli_argv
from launcher.console import WarmStartProgress

__all__ = ["FOCUS_SHARE", "Check", "WarmStart", "last_check", "step_log", "tier_accuracy"]

# Share of each batch an extension of the warm start spends on the tiers not yet learned.
FOCUS_SHARE = 0.5


@dataclass
class Check:
    """What the loop needs of a recipe: the rows it trains on, the held-out rows the sft run
    evaluates (per tier), and how an extension picks its rows."""

    train: Path
    check_rows: list[dict[str, Any]]
    tiers: list[str]
    # Words for the log line: "warm start checked (<what>): <tier> <accuracy>, ...".
    what: str
    # The train rows an extension mixes toward the weak tiers (the arithmetic task); None: an
    # extension trains longer on ``train`` itself (the products task).
    focus: list[dict[str, Any]] | None = None


def step_log(sft: Path) -> Path:
    """The step log of the sft run that writes ``sft`` (its run folder is ``<sft>.run``)."""
    return sft_run_dir(sft) / "metrics.jsonl"


def last_check(sft: Path) -> dict:
    """The sft run's last evaluation record."""
    return [r for r in read_records(step_log(sft), "kind") if r["kind"] == "eval"][-1]


def tier_accuracy(sft: Path, tiers: list[str]) -> dict[str, float]:
    """Per-tier greedy accuracy of the sft run's last evaluation (its ``eval_exact/<tier>``)."""
    last = last_check(sft)
    return {t: float(last.get(f"eval_exact/{t}", 0.0)) for t in tiers}


def demonstrations(data: Path, demos: str) -> Path:
    """Where the ``products``/``when`` warm start writes its supervised rows (the SFT control
    trains on the same file)."""
    return data / f"warm_start_{demos}.parquet"


def _write(rows: list[dict[str, Any]], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _read(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


class WarmStart:
    """The warm start of one ``up`` run: ``run_step`` runs a command line as a named step (the
    supervisor's; it calls its third argument while the step runs), ``say`` prints a line."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        run_step: Callable[[str, list[str], Callable[[], object]], Any],
        say: Callable[[str], None],
    ) -> None:
        self.cfg = cfg
        self.ws = cfg.up.warm_start
        self.data = run_dir / "data"
        self.run_step = run_step
        self.say = say

    def run(self, init: Path, sft: Path) -> None:
        """Warm-start ``init`` into ``sft`` with the recipe the config names."""
        if self.cfg.rollout.dataset:
            self.sft(init, sft, self.cfg.rollout.dataset, self.ws.steps)
            return
        if self.cfg.rollout.env.name == "verifiers":
            self.sft(init, sft, self.verifiers_answers(init), self.ws.steps)
            return
        demos = self.cfg.up.task in ("products", "when")
        check = self.products(init, sft) if demos else self.task(init, sft)
        if check is not None:
            self.checked(init, sft, check)

    def sft(
        self,
        init: Path,
        sft: Path,
        data: str,
        steps: int,
        options: Sequence[str] = (),
        overrides: Sequence[str] = (),
        label: str = "",
        batch_size: int | None = None,
    ) -> None:
        """One ``dynamo-rl sft`` call, its progress on the console; a later call with more steps
        resumes the same run."""
        ws = self.ws
        self.say(f"supervised warm start{label}: {steps} steps on {data}")
        progress = WarmStartProgress(step_log(sft), steps, self.say)
        self.run_step(
            "sft",
            cli_argv("sft", "--model", str(init), "--data", data,
                     "--out", str(sft), "--steps", str(steps), "--lr", str(ws.lr),
                     "--batch-size", str(batch_size or ws.batch_size), *options,
                     "--seed", str(self.cfg.run.seed),
                     f"learner.optim.grad_clip={ws.grad_clip or 'null'}",
                     f"learner.optim.weight_decay={ws.weight_decay}",
                     # The warm start renders prompts exactly as the rollout worker will.
                     f"learner.data.template={self.cfg.rollout.prompt_template}", *overrides),
            progress.poll,
        )  # fmt: skip

    # -- recipes: each trains unchecked itself, or returns the Check the loop runs ---------------

    def verifiers_answers(self, init: Path) -> str:
        """A verifiers environment's rows with their ``answer`` as the reply, written by the
        rollout worker's program (``dynamo-rl rollout --write-answers``; ``init``'s tokenizer)."""
        self.data.mkdir(parents=True, exist_ok=True)
        out = self.data / "warm_start_verifiers.parquet"
        self.run_step(
            "write-answers",
            cli_argv("rollout", "--config", str(self.data.parent / "config.yaml"),
                     "--write-answers", str(out), f"rollout.tokenizer={init}"),
            lambda: None,
        )  # fmt: skip
        return str(out)

    def task(self, init: Path, sft: Path) -> Check | None:
        """The arithmetic task: the rows of ``up.warm_start.tiers``, ``check_rows`` per tier held
        out."""
        from tasks.arith import check_split

        ws = self.ws
        rows = _read(self.data / "train.parquet")
        present = {r["extra_info"]["tier"] for r in rows}
        missing = [t for t in ws.tiers if t not in present]
        if missing:
            raise RuntimeError(
                f"up.warm_start.tiers: no train rows of {', '.join(missing)} (the task's tiers: "
                f"{', '.join(sorted(present))})"
            )
        if not ws.check_rows:
            tiers = ["--tiers", ",".join(ws.tiers)]
            self.sft(init, sft, str(self.data / "train.parquet"), ws.steps, tiers)
            return None
        train, check = check_split(rows, ws.tiers, ws.check_rows)
        path = _write(train, self.data / "warm_start.parquet")
        return Check(
            train=path,
            check_rows=check,
            tiers=[t for t in ws.tiers if any(r["extra_info"]["tier"] == t for r in check)],
            what=f"greedy accuracy on {len(check)} held-out train rows",
            focus=train,
        )

    def products(self, init: Path, sft: Path) -> Check | None:
        """The products task: its first ``up.warm_start.rows`` train questions (answers or tool
        demonstrations), checked on the next ``check_rows``."""
        ws = self.ws
        every = _read(self.data / "train.parquet")
        rows = every[: ws.rows] if ws.rows else every
        # The check: train questions the warm start never sees (after its rows).
        check = every[len(rows) : len(rows) + ws.check_rows]
        if ws.check_rows and not check:
            raise RuntimeError(
                "up.warm_start.check_rows: no train questions left after up.warm_start.rows to "
                "check the warm start on; lower up.warm_start.rows or raise up.task_train"
            )
        env = self.cfg.rollout.env
        if ws.demos != "answers" and (
            env.name not in ("tools", "code_interpreter")
            or self.cfg.rollout.prompt_template != "raw"
        ):
            raise RuntimeError(
                f"up.warm_start.demos={ws.demos}: needs rollout.env.name=tools (with the "
                "calculator tool) or code_interpreter, and rollout.prompt_template=raw"
            )
        if ws.demos != "answers" or self.cfg.up.task == "when":
            from tasks.when import demos

            seed = self.cfg.run.seed
            rows, check = demos(rows, env, ws.demos, seed), demos(check, env, ws.demos, seed + 1)
        path = demonstrations(self.data, ws.demos)
        _write(rows, path)
        if not check:
            self.sft(init, sft, str(path), ws.steps)
            return None
        return Check(
            train=path,
            check_rows=check,
            tiers=sorted({r["extra_info"]["tier"] for r in check}),
            what=f"greedy exact match on {len(check)} rows of unseen train questions",
        )

    def control(self, sft: Path, out: Path) -> None:
        """The SFT-continuation control (``up.sft_control``): the warm-started ``sft`` trained
        on the warm start's own demonstrations for RL's compute, ``learner.max_steps`` steps of
        ``learner.train_batch_size`` x ``allocator.n_per_prompt`` rows, into ``out``."""
        cfg = self.cfg
        data = demonstrations(self.data, self.ws.demos)
        if not data.exists():
            raise RuntimeError(
                f"up.sft_control: no warm-start demonstrations at {data} (the products and when "
                "tasks write them, with up.warm_start.steps > 0)"
            )
        steps, batch = (
            cfg.learner.max_steps or 0,
            cfg.learner.train_batch_size * cfg.allocator.n_per_prompt,
        )
        self.sft(
            sft,
            out,
            str(data),
            steps,
            label=" continued: the SFT control at RL's steps x batch",
            batch_size=batch,
        )

    # -- the loop ---------------------------------------------------------------------------------

    def checked(self, init: Path, sft: Path, check: Check) -> None:
        """Train, check per tier, extend until every tier reaches ``min_tier_accuracy`` (or an
        error after ``max_extensions``)."""
        ws = self.ws
        held_out = _write(check.check_rows, self.data / "warm_check.parquet")
        checked = [f"learner.data.eval_path={held_out}", "learner.data.group_key=extra_info.tier"]
        steps = self.first(init, sft, str(check.train), checked)
        for extension in range(ws.max_extensions + 1):
            accuracy = tier_accuracy(sft, check.tiers)
            shown = ", ".join(f"{t} {a:.2f}" for t, a in accuracy.items())
            self.say(f"warm start checked ({check.what}): {shown}")
            weak = [t for t, a in accuracy.items() if a < ws.min_tier_accuracy]
            if not weak:
                return
            # The arithmetic task names its weak tiers (they can be left out of
            # up.warm_start.tiers); the products task's questions are one kind.
            named = f"tiers {', '.join(weak)} " if check.focus is not None else ""
            if extension == ws.max_extensions:
                raise RuntimeError(
                    f"up.warm_start: {named}still below up.warm_start.min_tier_accuracy "
                    f"({ws.min_tier_accuracy}) after {steps} steps and {ws.max_extensions} "
                    "extensions (up.warm_start.max_extensions); raise up.warm_start.steps or lr"
                    + (", or leave those tiers out of up.warm_start.tiers" if named else "")
                )
            path, label = check.train, f" extended (below {ws.min_tier_accuracy})"
            if check.focus is not None:
                from tasks.arith import focus_mix

                mix = focus_mix(check.focus, weak, FOCUS_SHARE, seed=self.cfg.run.seed + extension)
                path = _write(mix, self.data / f"warm_focus{extension + 1}.parquet")
                label = f" extended for {', '.join(weak)} (below {ws.min_tier_accuracy})"
            steps += ws.extend_steps
            self.sft(init, sft, str(path), steps, (), checked, label)

    def first(self, init: Path, sft: Path, data: str, checked: list[str]) -> int:
        """The first sft call of a checked warm start: ``up.warm_start.steps``, or up to them until
        the check reaches ``target_exact``. Returns the steps it trained."""
        ws = self.ws
        if ws.target_exact is None:
            self.sft(init, sft, data, ws.steps, (), checked)
            return ws.steps
        target = [f"learner.data.stop_exact={ws.target_exact}",
                  f"learner.data.eval_every={ws.check_every}"]  # fmt: skip
        label = f" until the check's exact match reaches {ws.target_exact}, at most"
        self.sft(init, sft, data, ws.steps, (), [*checked, *target], label)
        last = last_check(sft)
        self.say(f"warm start: {last['step']} steps, exact match "
                 f"{last['eval_exact']:.3f} on the check (target {ws.target_exact})")  # fmt: skip
        return int(last["step"])
