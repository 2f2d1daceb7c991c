"""What ``dynamo-rl up`` (and ``dynamo-rl stage``) print while their children work, read from the
files the children write — never from their free-text logs:

- :class:`StepProgress`: one line per learner step from the learner's ``metrics.jsonl`` (step,
  rollouts used, reward, train accuracy, the reverse KL to a distillation teacher, tokens/s,
  ETA); a step whose rewards were all equal is marked ``no signal`` unless a teacher scored it;
- :class:`WarmStartProgress`: the warm start's steps from its sft run's ``metrics.jsonl`` (step,
  loss, steps/s, ETA) — the first, every tenth of the run, any after :data:`QUIET_S` seconds
  without a line, and the last — and each check's exact match when the run evaluates;
- :class:`NoticeBoard`: the warnings a user must act on (:mod:`dynamo_rl.notices`), each once, one
  line naming the service and pointing to its log;
- :func:`data_lines`: what the run will train on, before it trains.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dynamo_rl.jsonl import Tail
from dynamo_rl.notices import Notice, NoticeTail

__all__ = [
    "QUIET_S",
    "NoticeBoard",
    "StepProgress",
    "WarmStartProgress",
    "data_lines",
    "notice_line",
]

QUIET_S = 30.0
"""Longest the console stays silent while the warm start trains (a line at least this often)."""

Say = Callable[[str], None]


class StepProgress:
    """Turns new lines of the learner's metrics.jsonl into one compact line per step."""

    def __init__(self, path: Path, max_steps: int | None, say: Say) -> None:
        self.tail = Tail(path, "step")
        self.max_steps = max_steps
        self.say = say
        self.rollouts = 0
        self.last = 0
        self.started: float | None = None
        self.first_step: int | None = None

    def poll(self) -> None:
        for r in self.tail.read():
            self.show(r)

    def show(self, r: dict[str, Any]) -> None:
        step = int(r.get("step", 0))
        self.last = max(self.last, step)
        now = time.monotonic()
        if self.started is None:
            self.started, self.first_step = now, step
        self.rollouts += int(r.get("responses", 0))
        parts = [f"step {step}" + (f"/{self.max_steps}" if self.max_steps else "")]
        parts.append(f"rollouts {self.rollouts}")
        for key, label in (("reward_mean", "reward"), ("accuracy_mean", "acc"),
                           ("opd_reverse_kl", "kl to teacher"),
                           ("tokens_per_second", "tok/s")):  # fmt: skip
            if key in r:
                parts.append(f"{label} {r[key]:.3g}")
        done = step - (self.first_step or 0)
        if self.max_steps and done > 0:
            per_step = (now - self.started) / done
            parts.append(f"ETA {per_step * (self.max_steps - step):.0f}s")
        if r.get("rewards_all_equal") and "opd_reverse_kl" not in r:  # the teacher's is a signal
            parts.append("no signal (every reward equal)")
        self.say("  ".join(parts))


class WarmStartProgress:
    """The progress of one ``dynamo-rl sft`` call of the warm start, from its run's step log
    (``<sft>.run/metrics.jsonl``; a resumed run's earlier lines are skipped)."""

    def __init__(self, path: Path, steps: int, say: Say, label: str = "warm start") -> None:
        self.tail = Tail(path, "step", from_end=True)
        self.steps = steps
        self.say = say
        self.label = label
        self.every = max(1, steps // 10)
        self.first: tuple[int, float] | None = None  # (step, time_unix) of the first step seen
        self.said = 0.0  # monotonic time of the last line

    def poll(self) -> None:
        for r in self.tail.read():
            if r.get("kind") == "eval":
                self.check(r)
            elif "loss" in r:
                self.step(r)

    def step(self, r: dict[str, Any]) -> None:
        step, t = int(r["step"]), float(r.get("time_unix", time.time()))
        if self.first is None:
            self.first = (step, t)
        due = step == self.first[0] or step >= self.steps or step % self.every == 0
        if not due and time.monotonic() - self.said < QUIET_S:
            return
        parts = [f"{self.label} step {step}/{self.steps}", f"loss {float(r['loss']):.4f}"]
        done, elapsed = step - self.first[0], t - self.first[1]
        if done > 0 and elapsed > 0:
            rate = done / elapsed
            parts += [f"{rate:.2f} steps/s", f"ETA {max(0, self.steps - step) / rate:.0f}s"]
        self.said = time.monotonic()
        self.say("  ".join(parts))

    def check(self, r: dict[str, Any]) -> None:
        if "eval_exact" not in r:
            return
        groups = ", ".join(f"{k.split('/', 1)[1]} {float(v):.2f}" for k, v in sorted(r.items())
                           if k.startswith("eval_exact/"))  # fmt: skip
        self.say(f"{self.label} check at step {r['step']}: exact match {float(r['eval_exact']):.3f}"
                 + (f" ({groups})" if groups else ""))  # fmt: skip


def notice_line(n: Notice, logs: Path | None = None) -> str:
    """One console line for a notice: the service, the message, and where its log is."""
    log = logs / f"{n.service}.log" if logs is not None else None
    where = str(log) if log is not None and log.exists() else f"the {n.service} service's log"
    return f"warning from {n.service}: {n.message} (more in {where})"


class NoticeBoard:
    """Prints each new notice of the watched run folders once (:func:`notice_line`), reading only
    what was appended since the last poll."""

    def __init__(self, folders: Sequence[Path], say: Say, logs: Path | None = None) -> None:
        self.notices = NoticeTail(list(folders))
        self.say = say
        self.logs = logs

    @property
    def shown(self) -> list[Notice]:
        """Every notice printed so far, in order (``up``'s summary counts them)."""
        return list(self.notices.seen.values())

    def poll(self) -> list[Notice]:
        new = self.notices.poll()
        for n in new:
            self.say(notice_line(n, self.logs))
        return new


def data_lines(s: dict[str, Any]) -> list[str]:
    """What the run will train on, from ``dynamo-rl rollout --check-data``'s summary: rows kept and
    dropped, the data sources and their scorers, the model's context and ``max_tokens``, and the
    setting to change when the length policy touched more than a tenth of the rows."""
    rows, kept, over = int(s["rows"]), int(s["kept"]), int(s["over"])
    head = f"training data {s['dataset']}: {kept:,} of {rows:,} rows kept"
    if over:
        done = "dropped" if s["policy"] == "drop" else "truncated"
        head += (f" ({over:,} longer than {s['limit']:,} tokens {done}, "
                 f"rollout.prompt_len_policy={s['policy']})")  # fmt: skip
    if s.get("max_prompts") is not None and rows == s["max_prompts"]:
        head += " (the file's first rows, rollout.max_prompts)"
    lines = [head]
    lines += [f"  data source {src['data_source']}: {int(src['rows']):,} rows, scored by "
              f"{src['scorer']}" for src in s["sources"]]  # fmt: skip
    context = f"{s['context']:,} tokens" if s["context"] else "unknown"
    limit = f"prompts up to {s['limit']:,} tokens" if s["limit"] else "no prompt length limit"
    source = " (rollout.max_prompt_len)" if s["max_prompt_len"] is not None else ""
    lines.append(f"  model context {context}, rollout.sampling.max_tokens {s['max_tokens']:,}: "
                 f"{limit}{source}")  # fmt: skip
    if s.get("hint"):
        lines.append(f"  {s['hint']}")
    return lines
