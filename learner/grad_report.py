"""The learner's per-prompt gradient statistics, collected during the RL step's own update pass.

:class:`GradStatsCollector` hooks the LM head's forward (its input norms and output logits give
each token's output-layer ghost norm, ``learner/algorithms/gradstats.py``) and each micro-batch's
log-probs in the backward that runs anyway (their gradient is every token's ∂loss/∂logp); no
extra forward or backward. After the step, :meth:`GradStatsCollector.records` reduces them per
prompt (over every rank) to the :class:`dynamo_rl.contracts.gradstats.GradRecord` the trainer
writes to Redis for the allocator, and ``seconds`` is what all of it cost (the step record's
``time_grad_stats``; ``benchmarks/grad_stats_cost.py`` measures it against a whole step).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from dynamo_rl.contracts.gradstats import GradRecord
from learner.algorithms.gradstats import (
    group_grad_stats,
    output_ghost_norms,
    response_grad_norms,
)
from learner.batch import MicroBatch, Sample
from learner.dist import all_gather_object

__all__ = ["GradStatsCollector", "lm_head_of", "step_fields"]


def lm_head_of(model: nn.Module) -> nn.Module:
    """The model's output layer: its last submodule named ``lm_head`` (wrapped or not)."""
    heads = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == "lm_head"]
    if not heads:
        raise ValueError("the policy has no lm_head module: gradient statistics need one")
    return heads[-1]


class GradStatsCollector:
    """Per-response statistics s_j of one train step (batch row → s_j, this rank's rows)."""

    def __init__(self, model: nn.Module) -> None:
        self.head = lm_head_of(model)
        self.norms: dict[int, float] = {}
        self.seconds = 0.0
        self._mb: MicroBatch | None = None
        self._ghost: torch.Tensor | None = None

    def reset(self) -> None:
        self.norms.clear()
        self.seconds = 0.0

    def _on_head(self, _module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
        mb = self._mb
        if mb is None:
            return
        t0 = time.perf_counter()
        h_norm = args[0].detach().float().norm(dim=-1)
        self._ghost = output_ghost_norms(out.detach(), mb.response_ids, h_norm, mb.temperature)
        self.seconds += time.perf_counter() - t0

    @contextmanager
    def watch(self, mb: MicroBatch) -> Iterator[None]:
        """Around a micro-batch's forward: keep its tokens' ghost norms."""
        self._mb, self._ghost = mb, None
        handle = self.head.register_forward_hook(self._on_head)
        try:
            yield
        finally:
            handle.remove()
            self._mb = None

    def track(self, logp: torch.Tensor, mb: MicroBatch, normalizer: float, scale: float) -> None:
        """Before the micro-batch's backward (of ``scale`` × its loss): record each row's s_j
        when the gradient reaches ``logp``."""
        ghost = self._ghost
        if ghost is None or not logp.requires_grad:
            return
        rows, mask = list(mb.rows), mb.mask

        def on_grad(grad: torch.Tensor) -> None:
            t0 = time.perf_counter()
            s = response_grad_norms(grad.detach() / scale, ghost, mask, normalizer)
            for row, value in zip(rows, s.tolist(), strict=True):
                self.norms[row] = self.norms.get(row, 0.0) + value
            self.seconds += time.perf_counter() - t0

        logp.register_hook(on_grad)

    def records(self, samples: Sequence[Sample], prompt_ids: Sequence[str]) -> list[GradRecord]:
        """Collective: every rank's rows reduced per prompt (group ``g`` is ``prompt_ids[g]``)."""
        t0 = time.perf_counter()
        merged: dict[int, float] = {}
        for part in all_gather_object(dict(self.norms)):
            merged.update(part)
        rows = sorted(merged)
        if not rows:
            return []
        groups = torch.tensor([samples[r].group for r in rows])
        ids, mean, spread = group_grad_stats(torch.tensor([merged[r] for r in rows]), groups)
        rewards: dict[int, set[float]] = {}
        for s in samples:
            rewards.setdefault(s.group, set()).add(s.reward)
        out = [
            GradRecord(prompt_ids[gi], m, sp, len(rewards[gi]) == 1)
            for gi, m, sp in zip(ids.tolist(), mean.tolist(), spread.tolist(), strict=True)
            if prompt_ids[gi]
        ]
        self.seconds += time.perf_counter() - t0
        return out


def step_fields(records: Sequence[GradRecord], sizes: Sequence[int]) -> dict[str, Any]:
    """The step record's view of a step's statistics (``sizes``: each record's group size, its
    allocation): per prompt [n, spread] (``grad_alloc``), their correlation, the mean spread,
    the share of zero-advantage groups, and the estimated variance of this allocation against
    uniform n at the same total, Σ spread²/n ÷ Σ spread²/n̄ (``grad_var_ratio``; < 1: allocation
    lowered the variance by that factor)."""
    if not records:
        return {}
    n = torch.tensor([float(x) for x in sizes], dtype=torch.float64)
    sp = torch.tensor([r.spread for r in records], dtype=torch.float64)
    uniform = float((sp.square() / n.mean()).sum())
    corr = 0.0
    if len(records) > 1 and float(n.std()) > 0 and float(sp.std()) > 0:
        corr = float(torch.corrcoef(torch.stack([n, sp]))[0, 1])
    return {
        "grad_alloc": [[int(a), round(b, 6)] for a, b in zip(sizes, sp.tolist(), strict=True)],
        "grad_alloc_corr": corr,
        "grad_var_ratio": float((sp.square() / n).sum()) / uniform if uniform > 0 else 1.0,
        "grad_spread_mean": float(sp.mean()),
        "grad_zero_adv_share": sum(r.zero_advantage for r in records) / len(records),
        "grad_stats_prompts": len(records),
    }
