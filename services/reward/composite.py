"""Composite rewards: one reward spec per ``data_source`` (as verl routes ``data_source`` to a
scorer), made of weighted, optionally gated components.

An item whose ``data_source`` has a spec in ``reward.composite`` (or that falls under ``"*"``) is
scored by every component of the spec instead of by its ``kind`` alone:

- ``math``/``code``/``model``/``judge`` components build that kind's item from the item's own
  fields (``ground_truth``, ``tests``, ``prompt``, ``response``; a judge's ``reference`` is the
  ``ground_truth``) and ask that kind's scorer; a field a component needs and the item lacks is a
  422 naming it, before anything runs;
- ``format`` (a regex, or the verifier's ``format_ok``) and ``length`` (DAPO's soft overlong
  penalty) are computed here.

Ungated components run concurrently; then the gated ones whose gate component is ``correct``
(the others are not run at all and score 0: a reward model or a judge costs time). The total is
``sum(weight * score)``; ``correct``, ``format_ok`` and ``reason`` come from the verifier
component (``correct_from``, by default the first math/code one), or without one from the total
against ``correct_threshold``. The result's ``components`` holds every component's unweighted
score (and ``<name>_raw`` for reward models), so the trajectory keeps the breakdown.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from pydantic import ValidationError

from dynamo_rl.config import RewardConfig
from dynamo_rl.config.reward import (
    FormatComponent,
    JudgeComponent,
    LengthComponent,
    ModelComponent,
    RewardSpec,
)
from dynamo_rl.contracts.reward import ItemBase, ItemResult, Reason
from services.reward.base import Scorer
from services.reward.metrics import RewardMetrics

log = logging.getLogger("services.reward")

KIND = "composite"
SCORED_KINDS = ("math", "code", "model", "judge")
FAILURES = ("timeout", "unparseable", "upstream_error", "model_error", "internal_error")

Problems = list[tuple[tuple[str | int, ...], str]]


def overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO: 0 up to ``max_length - buffer``, linear to -1 at ``max_length``, -1 beyond."""
    if length <= max_length - buffer:
        return 0.0
    if length > max_length:
        return -1.0
    return (max_length - buffer - length) / buffer


class CompositeRouter:
    """Routes items by ``data_source`` to their spec and scores the spec's components."""

    def __init__(self, cfg: RewardConfig, scorers: dict[str, Scorer], metrics: RewardMetrics):
        self.cfg, self.scorers, self.metrics = cfg, scorers, metrics

    @property
    def capacity(self) -> int:
        return self.cfg.composite_max_pending

    def route(self, item: ItemBase) -> tuple[str, RewardSpec] | None:
        """``(spec key, spec)`` for the item, or ``None`` when it is scored by its kind alone (a
        ``reasoning_gym`` item always is: no component scores it)."""
        if getattr(item, "kind", None) not in SCORED_KINDS:
            return None
        source = item.data_source
        if source is not None and source in self.cfg.composite:
            return source, self.cfg.composite[source]
        if source is not None and "*" in self.cfg.composite:
            return "*", self.cfg.composite["*"]
        return None

    def _component_item(self, item: ItemBase, c: Any) -> Any:
        """The item the component's kind scores; raises ValidationError when a field is missing."""
        target = self.scorers[c.kind].item_model
        data = item.model_dump(exclude={"data_source"})
        data["kind"] = c.kind
        if isinstance(c, ModelComponent):
            data["model"] = c.model
        if isinstance(c, JudgeComponent):
            data["judge"] = c.judge
            data["reference"] = data.get("reference") or data.get("ground_truth") or ""
        return target.model_validate({k: v for k, v in data.items() if k in target.model_fields})

    def check(self, item: ItemBase, key: str, spec: RewardSpec) -> Problems:
        problems: Problems = []
        for i, c in enumerate(spec.components):
            if c.kind not in SCORED_KINDS:
                continue
            where = f"component {c.label!r} (reward.composite.{key}.components.{i})"
            try:
                sub = self._component_item(item, c)
            except ValidationError as e:
                for err in e.errors():
                    msg = "field required" if err["type"] == "missing" else err["msg"]
                    problems.append((tuple(err["loc"]), f"{msg}: needed by {where}"))
                continue
            problems += [(loc, f"{msg} ({where})") for loc, msg in self.scorers[c.kind].check(sub)]
        return problems

    async def _run(self, item: ItemBase, c: Any) -> ItemResult:
        scorer = self.scorers[c.kind]
        try:
            return await scorer.score(self._component_item(item, c))
        except Exception as e:
            log.exception("component %s of item %r failed", c.label, item.id)
            return ItemResult(
                id=item.id, score=0.0, correct=False, format_ok=False,
                reason="internal_error", detail=type(e).__name__,
            )  # fmt: skip

    def _local(self, item: ItemBase, c: Any, verifier: ItemResult | None) -> ItemResult:
        response: str = getattr(item, "response", "")
        if isinstance(c, FormatComponent):
            if c.pattern is not None:
                ok = re.search(c.pattern, response, re.DOTALL) is not None
            else:
                ok = verifier is not None and verifier.format_ok
            return ItemResult(
                id=item.id, score=float(ok), correct=ok, format_ok=ok,
                reason="ok" if ok else "wrong_answer",
            )  # fmt: skip
        assert isinstance(c, LengthComponent)
        by_tokens = item.response_length is not None
        length = item.response_length if by_tokens else len(response)
        penalty = overlong_penalty(length, c.max_length, c.buffer)  # type: ignore[arg-type]
        return ItemResult(
            id=item.id, score=penalty, correct=penalty == 0.0, format_ok=True,
            reason="ok" if penalty == 0.0 else "wrong_answer",
            detail=f"{length} {'tokens' if by_tokens else 'chars'}",
        )  # fmt: skip

    async def score(self, item: ItemBase, key: str, spec: RewardSpec) -> ItemResult:
        verifier_name = spec.verifier()
        results: dict[str, ItemResult] = {}
        gated_off: set[str] = set()

        async def run_wave(components: list[Any]) -> None:
            remote = [c for c in components if c.kind in SCORED_KINDS]
            done = await asyncio.gather(*(self._run(item, c) for c in remote))
            results.update({c.label: r for c, r in zip(remote, done, strict=True)})
            verifier = results.get(verifier_name) if verifier_name else None
            for c in components:
                if c.kind not in SCORED_KINDS:
                    results[c.label] = self._local(item, c, verifier)

        await run_wave([c for c in spec.components if c.gate is None])
        open_ = []
        for c in spec.components:
            if c.gate is None:
                continue
            if results[c.gate].correct:
                open_.append(c)
            else:
                gated_off.add(c.label)
        await run_wave(open_)

        total = 0.0
        components: dict[str, float] = {}
        notes: list[str] = []
        for c in spec.components:
            label = c.label
            if label in gated_off:
                components[label] = 0.0
                notes.append(f"{label}: gated off ({c.gate} not correct)")
                self.metrics.components.labels(key, label, "gated").inc()
                continue
            r = results[label]
            components[label] = r.score
            if r.raw_score is not None and c.kind == "model":
                components[f"{label}_raw"] = r.raw_score
            total += c.weight * r.score
            outcome = "failed" if r.reason in FAILURES else "scored"
            self.metrics.components.labels(key, label, outcome).inc()
            self.metrics.component_score.labels(key, label).observe(r.score)
            note = f"{label}={r.score:.4g}"
            if r.reason not in ("ok", "wrong_answer") or r.detail:
                note += f" ({r.reason}{': ' + r.detail if r.detail else ''})"
            notes.append(note)

        verifier = results.get(verifier_name) if verifier_name else None
        reason: Reason
        if verifier is not None:
            correct, format_ok, reason = verifier.correct, verifier.format_ok, verifier.reason
        else:
            correct, format_ok = total >= spec.correct_threshold, True
            failed = [r.reason for r in results.values() if r.reason in FAILURES]
            reason = failed[0] if failed else ("ok" if correct else "wrong_answer")  # type: ignore[assignment]
        self.metrics.component_score.labels(key, "total").observe(total)
        return ItemResult(
            id=item.id, score=total, correct=correct, format_ok=format_ok, reason=reason,
            detail=f"[{key}] " + "; ".join(notes), components=components,
        )  # fmt: skip
