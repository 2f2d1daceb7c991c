"""Gradient-estimate quality at equal budget: uniform n against Dynamic Rollout Allocation.

The paper's central claim is a mechanism: allocating a batch's samples in proportion to each
prompt's σ lowers the variance of the policy-gradient estimate at a fixed budget. This measures it
directly, on the built-in ``arith`` task with the quickstart's tiny model, at checkpoints of a real
run (the quickstart's warm start, then after ``--rl-steps`` in-process RL steps of uniform GRPO +
modulation, as ``benchmarks/sample_efficiency.py`` trains).

Design (cheap enough for 2 loaded CPU cores): for a fixed set of ``prompts`` train prompts, a pool
of ``pool`` samples per prompt is generated once per checkpoint. For every pool token the gradient
of its log-prob over **all** parameters is computed once and stored count-sketched to ``sketch``
dimensions (a fixed random hash and sign per parameter coordinate; inner products are unbiased,
relative error ≈ 1/√sketch). A batch then draws, with replacement, n_i samples of prompt i from its
pool (n_i from the allocator under test, Σ n_i = B × prompts); its loss and backward are the
learner's own step (``learner.step.RLStep`` with ``update=False``: the shipped DynaMO recipe, GRPO
advantages over the batch, PPO-clip 0.2/0.28, dual clip 10, modulation decay6 per micro-batch of
``micro_batch`` rows, on-policy, ``agg`` token-mean or prompt-mean with the whole batch's
normaliser), its forward handing back the pool's log-probs as leaves; the backward gives
∂loss/∂logp for every token, and the parameter gradient is Σ ∂loss/∂logp · ∇logp (the chain rule:
modulation and the clip use detached log-probs, there is no KL or entropy term), read from the
sketch. ``chain_rule_check`` in the JSON compares that with a real ``backward()`` through the model
on one batch.

The allocator sees statistics from earlier samples, as in training: per batch, the previous
visit's group of ``stat_samples`` draws from the pool per prompt (G, k) and the learner's gradient
statistic of that group (``learner/algorithms/gradstats.py``: output-layer ghost norms times the
learner's own loss coefficients, prompt-mean; ``visit_stats``), plus the group of the visit before
it (the skip rule's zero-advantage streak). Every runnable allocator takes the suffixes ``@8``
(a previous group of 8) and ``@stale`` (at an RL checkpoint: statistics drawn from the warm
start's pool of the same prompts, and the allocator told they are ``rl_steps`` weight versions
old). The suffix ``@h<H>`` (``grad@h4``; ``--half-lives 1,4,16`` adds ``grad@hH`` and ``dra@hH`` for
each H) gives statistics that survive between visits (``allocator.stats_half_life`` = H): the last
``history`` visits of a group of 8, visit j made j·``revisit`` weight versions ago (from the warm
start's pool once that is over half the checkpoint's RL steps: the policy it saw was nearer the
warm start's), merged as the Redis scripts merge them (:func:`merge_visits`) — the measurement that
chooses the half-life. Variants: ``uniform``; ``dra`` (scheme reference, priority variance: the shipped recipe's
allocator); ``dra-wl-std`` (water-level, std); each with hopeless prompts (k = 0 after ≥
``stat_samples`` samples) cut to ``hopeless_n`` responses (``+hl``); ``grad`` (the allocator's
grad method on that statistic), ``grad+skip`` (with the skip rule, ``skip_after`` 1), ``knapsack``
(Knapsack RL's value); all within the recipe's range scaled to the budget
(``configs/dynamo_grpo.yaml``: 8..24 at n = 16, so B/2..3B/2) and with its initial budget,
mastery threshold and min priority. ``dra-wide`` is ``dra`` with n_min 2, n_max 2B (the first
measurement's range), ``grad-wide`` and ``knapsack-wide`` the same for those methods. Three allocators training could not run: ``grad-full``, the grad method on
the spread of the previous group's *full-model* per-sample gradients (what a perfect per-sample
statistic would give); and, both within 1..2B, ``oracle``, n_i ∝ each prompt's own gradient spread
measured on the pool (``gradient_spread``) — the Neyman allocation, about the least variance
any allocation of the budget can reach (up to the noise of its spread estimates); and
``oracle-sigma``, n_i ∝ the σ of each prompt's success rate over the whole pool (what σ-allocation
does with exact statistics). ``--advantage drgrpo`` replaces GRPO's advantages with Dr.GRPO's
(not divided by the group std). ``prompt_sets`` disjoint sets of ``prompts`` prompts are measured
in turn; ``summary`` in the JSON gives every ratio per set, and each allocator's share of the
oracle's reduction, (1 − ratio) / (1 − oracle's ratio) (``oracle_share``). Runs over other prompt
sets (``--prompt-offset``, in parallel) combine into one report with ``--merge``.

The reference gradient of a checkpoint and weighting is the gradient of the whole pool (``pool``
samples for every prompt). Per case: relative MSE E‖g − g_ref‖² / ‖g_ref‖², its variance part
E‖g − E g‖² / ‖g_ref‖², cosine to the reference, the share of rollouts with zero advantage (groups
whose rewards are all equal), each with a 95% interval over ``batches`` independent batches, and
the ratio of MSE to uniform's (interval by the delta method).

    .venv/bin/python benchmarks/grad_variance.py --quick    # smoke run (~15 s)
    .venv/bin/python benchmarks/grad_variance.py            # full run (~1 h), JSON + PNG in results/
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from _machine import write_result  # noqa: E402 - the result file, with its machine

RESULTS = REPO / "benchmarks" / "results"
WEIGHTINGS = ("token-mean", "prompt-mean")
ADVANTAGES = ("grpo", "drgrpo", "rloo")


@dataclass
class GVSettings:
    prompts: int = 32
    """Prompts per set (a fixed set: consecutive rows of the RL train pool)."""
    prompt_offset: int = 0
    """Row of the RL train pool the first set starts at."""
    pool: int = 32
    """Samples per prompt generated once per checkpoint (batches draw from them)."""
    prompt_sets: int = 3
    """Disjoint prompt sets measured one after the other (each ``prompts`` rows on from the last);
    the summary gives each ratio per set and its range."""
    rl_steps: str = "0,40"
    """Checkpoints: RL steps after the warm start (0 = the warm start itself)."""
    budgets: str = "4,8,16"
    """Average samples per prompt B."""
    batches: int = 400
    """Independent batches per (checkpoint, budget, allocator)."""
    stat_samples: int = 16
    """Samples behind each prompt's allocator statistics (drawn per batch)."""
    hopeless_n: int = 1
    oracle_draws: int = 64
    """Groups drawn per prompt to measure its gradient spread (the ``oracle`` allocator)."""
    advantage: str = "grpo"
    """Advantage estimator of the batch loss: grpo (the recipe's), drgrpo or rloo."""
    allocators: str = (
        "uniform,dra,dra@8,dra@stale,dra-wide,grad,grad@8,grad@stale,grad+skip,grad-wide,"
        "grad-wide@8,grad-wide@stale,knapsack,knapsack-wide,grad-full,oracle,oracle-sigma"
    )
    """Allocators measured (uniform is the baseline and always included; runnable ones take the
    suffixes @8 and @stale, see ``VARIANTS``)."""
    sketch: int = 8192
    micro_batch: int = 64
    """Rows per micro-batch (the quickstart's learner.micro_batch_size): modulation's range."""
    rl_batch: int = 16
    rl_n: int = 8
    seed: int = 0
    half_lives: str = ""
    """Half-lives H (weight versions) to measure: adds grad@hH and dra@hH for each (``@h``)."""
    revisit: int = 4
    """@h: weight versions between two visits of a prompt."""
    history: int = 4
    """@h: earlier visits behind a visit-averaged statistic."""


RECIPE = REPO / "configs" / "dynamo_grpo.yaml"

ALLOCATORS: dict[str, dict[str, Any]] = {
    "uniform": {},
    # The shipped recipe's allocator: its scheme and priority, its n range scaled to the budget.
    "dra": {"scheme": "reference", "priority": "variance"},
    "dra+hl": {"scheme": "reference", "priority": "variance", "hopeless": True},
    "dra-wl-std": {"scheme": "water-level", "priority": "std"},
    "dra-wl-std+hl": {"scheme": "water-level", "priority": "std", "hopeless": True},
    # The range of the first measurement: n_min 2, n_max 2B.
    "dra-wide": {"scheme": "reference", "priority": "variance", "wide": True},
    # The allocator's other methods, on statistics of the previous visit (``stat_samples``
    # samples; @8: 8): grad (n ∝ the learner's output-layer gradient spread), knapsack (Knapsack
    # RL's value), grad with the skip rule (streak from the two previous visits), and grad-full
    # (n ∝ the spread of the previous group's full-model gradients: what a perfect per-sample
    # statistic would give, not something the learner reports).
    "grad": {"method": "grad"},
    "grad+skip": {"method": "grad", "skip": True},
    "knapsack": {"method": "knapsack"},
    # ... the same in dra-wide's range (2..2B: a group needs two responses for an advantage).
    "grad-wide": {"method": "grad", "wide": True},
    "knapsack-wide": {"method": "knapsack", "wide": True},
    "grad-full": {"method": "grad", "full": True},
    # Not allocators training can run, both within 1..2B (as free as any variant above):
    # n ∝ each prompt's true per-sample gradient spread, measured on the pool (Neyman
    # allocation: about the least variance any allocation of this budget can reach) ...
    "oracle": {"oracle": "spread"},
    # ... and n ∝ the σ of each prompt's success rate over the whole pool (σ-allocation without
    # the noise of ``stat_samples`` draws).
    "oracle-sigma": {"oracle": "sigma"},
}
VARIANTS = ("@8", "@stale")
"""Suffixes of a runnable allocator's name: @8, statistics from a group of 8 (not
``stat_samples``); @stale, statistics measured on the warm start's samples used at the RL
checkpoint (their age, ``rl_steps`` weight versions, is what the allocator is told)."""


def spec_of(name: str) -> tuple[dict[str, Any], str]:
    """(the allocator's spec, its statistics variant: "", "@8", "@stale" or "@h<H>")."""
    base, sep, half = name.rpartition("@h")
    if sep and base in ALLOCATORS and ALLOCATORS[base] and not ALLOCATORS[base].get("oracle"):
        try:
            if float(half) > 0:
                return ALLOCATORS[base], "@h" + half
        except ValueError:
            pass
    for v in VARIANTS:
        if name.endswith(v) and name[: -len(v)] in ALLOCATORS:
            base = ALLOCATORS[name[: -len(v)]]
            if not base or base.get("oracle"):
                raise KeyError(name)
            return base, v
    return ALLOCATORS[name], ""


@functools.cache
def recipe_allocator():
    """The allocator section of the shipped DynaMO recipe (``configs/dynamo_grpo.yaml``)."""
    from dynamo_rl.config import load_config

    return load_config(RECIPE, env={}).allocator


def bounds_for(spec: dict[str, Any], budget_b: int) -> tuple[int, int]:
    """(n_min, n_max) at budget B: the recipe's range relative to its n; 2..2B (``wide``);
    1..2B (``oracle``)."""
    if spec.get("oracle"):
        return 1, 2 * budget_b
    if spec.get("wide"):
        return 2, 2 * budget_b
    a = recipe_allocator()
    lo = max(1, round(budget_b * a.n_min / a.n_per_prompt))
    return lo, max(lo, round(budget_b * a.n_max / a.n_per_prompt))


def algo_config(agg: str, advantage: str = "grpo"):
    """The shipped DynaMO recipe's objective (configs/dynamo_grpo.yaml), on-policy, with
    ``advantage``'s estimator."""
    from dynamo_rl.config.learner import AlgorithmConfig, ModulationConfig, PpoLoss

    return AlgorithmConfig(
        policy_loss=PpoLoss(clip_low=0.2, clip_high=0.28, dual_clip=10.0),
        advantage={"type": advantage},
        agg=agg,
        modulation=ModulationConfig(enabled=True, preset="decay6"),
        is_cap=None,
    )


# ---------------------------------------------------------------------------------------------
# Checkpoints


def rl_checkpoint(s, g: GVSettings, warm: Path, steps: int, cache: Path) -> Path:
    """``steps`` in-process RL steps of uniform GRPO + modulation from the warm start (cached)."""
    import numpy as np
    import torch
    from sample_efficiency import learner_config, learner_step, load, sampled_batch, task_rows

    if steps == 0:
        return warm
    out = cache / f"rl-{warm.name}-{steps}-{g.rl_batch}x{g.rl_n}-s{g.seed}"
    if (out / "done").exists():
        return out
    rl_pool, _, _ = task_rows(s)
    model, tok = load(warm)
    step_fn = learner_step(
        model, tok, learner_config(s, algo_config("token-mean"), groups=g.rl_batch, micro=64)
    )
    rng = np.random.default_rng(g.seed)
    t0 = time.time()
    for step in range(1, steps + 1):
        batch = rng.choice(len(rl_pool), g.rl_batch, replace=False).tolist()
        group_of = [i for i in range(g.rl_batch) for _ in range(g.rl_n)]
        model.eval()
        torch.manual_seed(g.seed * 1_000_003 + step)
        step_batch, rewards = sampled_batch(
            model, tok, s, [rl_pool[i] for i in batch], group_of, [str(i) for i in batch]
        )
        model.train()
        step_fn(step_batch)
        if step % 10 == 0:
            print(
                f"[rl] step {step} reward {float(rewards.mean()):.3f} ({time.time() - t0:.0f}s)",
                flush=True,
            )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "done").write_text("ok\n")
    return out


# ---------------------------------------------------------------------------------------------
# The pool: samples, per-token log-probs, entropies and sketched per-token gradients


class Sketch:
    """Count sketch of the model's parameter vector: coordinate j → bucket h(j), sign σ(j)."""

    def __init__(self, params, dim: int, seed: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        self.dim = dim
        self.buckets = [torch.randint(dim, (p.numel(),), generator=gen) for p in params]
        self.signs = [
            (torch.randint(2, (p.numel(),), generator=gen) * 2 - 1).float() for p in params
        ]

    def __call__(self, grads) -> Any:
        """``grads``: per-parameter tensors ``[K, *shape]`` → ``[K, dim]``."""
        import torch

        k = grads[0].shape[0]
        out = torch.zeros(k, self.dim)
        for gr, h, sg in zip(grads, self.buckets, self.signs, strict=True):
            out.index_add_(1, h, gr.reshape(k, -1) * sg)
        return out


def build_pool(
    model, tok, rows: list[dict], g: GVSettings, s, seed: int, cache_file: Path | None = None
) -> dict[str, Any]:
    """``pool`` samples per prompt with rewards, token log-probs/entropies and gradient sketches
    (kept in ``cache_file`` when given, so a rerun with other allocators skips this part)."""
    import torch
    from sample_efficiency import (
        decode_responses,
        generate,
        is_correct,
        prompt_text,
        response_mask,
    )

    from learner.algorithms import token_logprobs_and_entropy
    from learner.algorithms.gradstats import output_ghost_norms

    params = [p for p in model.parameters() if p.requires_grad]
    sketch = Sketch(params, g.sketch, seed=12345)
    if cache_file is not None and cache_file.exists():
        print(f"[pool] from {cache_file}", flush=True)
        return {**torch.load(cache_file), "sketch": sketch, "params": params}
    prompts = [prompt_text(r) for r in rows for _ in range(g.pool)]
    gts = [r["reward_model"]["ground_truth"] for r in rows for _ in range(g.pool)]
    model.eval()
    torch.manual_seed(seed)
    samples = []
    k = 0
    for seq, width, attn in generate(model, tok, prompts, greedy=False, s=s, chunk=1024):
        resp = seq[:, width:]
        rmask = response_mask(resp, tok.eos_token_id)
        texts = decode_responses(tok, resp, rmask)
        for j in range(seq.shape[0]):
            prompt_ids = seq[j, :width][attn[j].bool()].tolist()
            length = int(rmask[j].sum())
            samples.append(
                (prompt_ids, resp[j, :length].tolist(), float(is_correct(texts[j], gts[k])))
            )
            k += 1
    t_max = max(1, max(len(r) for _, r, _ in samples))
    n = len(samples)
    logp = torch.zeros(n, t_max)
    ent = torch.zeros(n, t_max)
    mask = torch.zeros(n, t_max)
    ghost = torch.zeros(n, t_max)
    grads = torch.zeros(n, t_max, g.sketch)
    heads: list[Any] = []  # the LM head's input (its hidden states), as the learner hooks it
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: heads.append(args[0].detach())
    )
    t0 = time.time()
    for i, (p_ids, r_ids, _) in enumerate(samples):
        if not r_ids:
            continue
        ids = torch.tensor([p_ids + r_ids])
        heads.clear()
        logits = model(input_ids=ids).logits[:, len(p_ids) - 1 : -1].float()
        h_norm = heads[0][:, len(p_ids) - 1 : -1].float().norm(dim=-1)
        ghost[i, : len(r_ids)] = output_ghost_norms(logits.detach(), torch.tensor([r_ids]), h_norm)[
            0
        ]
        with torch.no_grad():  # the learner's values; its fused backward does not vmap
            lp, en = token_logprobs_and_entropy(logits.detach(), torch.tensor([r_ids]))
        plain = torch.log_softmax(logits, -1)[0, torch.arange(len(r_ids)), r_ids][None]
        m = len(r_ids)
        eye = torch.eye(m).reshape(m, 1, m)
        per_tok = torch.autograd.grad(plain, params, grad_outputs=eye, is_grads_batched=True)
        grads[i, :m] = sketch(per_tok)
        logp[i, :m] = lp[0].detach()
        ent[i, :m] = en[0].detach()
        mask[i, :m] = 1.0
        if i % 256 == 0:
            print(f"[pool] {i}/{n} token gradients ({time.time() - t0:.0f}s)", flush=True)
    hook.remove()
    reward = torch.tensor([r for _, _, r in samples])
    data = {
        "samples": samples,
        "logp": logp,
        "ent": ent,
        "mask": mask,
        "ghost": ghost,
        "grads": grads,
        "reward": reward.reshape(len(rows), g.pool),
    }
    if cache_file is not None:
        torch.save(data, cache_file.with_suffix(".tmp"))
        cache_file.with_suffix(".tmp").replace(cache_file)
    return {**data, "sketch": sketch, "params": params}


# ---------------------------------------------------------------------------------------------
# One batch's gradient through the learner's step


def pool_batch(pool: dict, idx, groups):
    """The learner step's input of pool rows ``idx`` (row ``j`` in group ``groups[j]``), in
    that order (group by group, as the learner's mini-batches hold them)."""
    from learner.batch import Sample
    from learner.step import RLBatch

    rewards = pool["reward"].reshape(-1)
    samples = []
    for i, g in zip(idx.tolist(), groups, strict=True):
        p_ids, r_ids, _ = pool["samples"][i]
        samples.append(
            Sample(
                prompt=list(p_ids),
                response=list(r_ids),
                sampling_logprobs=pool["logp"][i, : len(r_ids)].tolist(),
                reward=float(rewards[i]),
                correct=bool(rewards[i] > 0),
                group=int(g),
            )
        )
    return RLBatch(samples=samples, prompt_ids=[""] * (max(groups, default=0) + 1))


def pool_step(agg: str, micro: int, advantage: str, groups, forward=None, model=None):
    """The learner's RL step (``learner.step.RLStep``) with the shipped recipe's objective
    (:func:`algo_config`), all of a batch's groups in one mini-batch, ``micro`` rows a
    micro-batch; its forward passes are ``forward`` (default: the model's own)."""
    import torch

    from dynamo_rl.config.learner import LearnerConfig
    from learner.model import PolicyModel
    from learner.step import RLStep, policy_forward

    lc = LearnerConfig(
        train_batch_size=max(1, len(set(groups))),
        micro_batch_size=micro,
        algorithm=algo_config(agg, advantage),
    )
    policy = PolicyModel(model) if model is not None else torch.nn.Identity()
    return RLStep(lc, policy, None, pad_id=0, forward=forward or policy_forward)


def batch_coefficients(pool: dict, idx, groups, agg: str, micro: int, advantage: str = "grpo"):
    """∂loss/∂logp ``[rows, T]`` of the learner step's loss on pool rows ``idx``.

    The step runs as the learner runs it (its plan, advantages over the batch, ``rl_objective``
    per micro-batch with the batch's normaliser, its backward, ``update=False``); only its
    forward differs: it hands back the pool's log-probs and entropies of those rows (the model's,
    computed once per pool) as leaves, whose gradients are the coefficients.
    """
    import torch

    rows = idx.tolist()
    leaves: list[tuple[list[int], torch.Tensor]] = []

    def forward(_model, mb, _entropy_grad):
        at = [rows[r] for r in mb.rows]
        t = mb.response_len
        logp = pool["logp"][at, :t].clone()
        if torch.is_grad_enabled():
            logp.requires_grad_(True)
            leaves.append((mb.rows, logp))
        return logp, pool["ent"][at, :t], None

    pool_step(agg, micro, advantage, groups, forward)(pool_batch(pool, idx, groups), update=False)
    coef = torch.zeros(len(rows), pool["logp"].shape[1])
    for at, leaf in leaves:
        coef[at, : leaf.shape[1]] += leaf.grad
    return coef


def batch_gradient(pool: dict, idx, groups, agg: str, micro: int, advantage: str = "grpo"):
    """Sketched parameter gradient Σ ∂loss/∂logp · ∇logp of the batch, and the coefficients."""
    import torch

    coef = batch_coefficients(pool, idx, groups, agg, micro, advantage)
    return torch.einsum("rt,rtd->d", coef, pool["grads"][idx]), coef


def true_gradient(model, pool: dict, idx, groups, agg: str, micro: int, advantage: str = "grpo"):
    """The same loss, backpropagated through the model (for the chain-rule check)."""
    import torch

    from learner.algorithms import token_logprobs_and_entropy

    _, coef = batch_gradient(pool, idx, groups, agg, micro, advantage)
    model.zero_grad(set_to_none=True)
    for j, i in enumerate(idx.tolist()):
        p_ids, r_ids, _ = pool["samples"][i]
        if not r_ids:
            continue
        ids = torch.tensor([p_ids + r_ids])
        logits = model(input_ids=ids).logits[:, len(p_ids) - 1 : -1].float()
        lp, _ = token_logprobs_and_entropy(logits, torch.tensor([r_ids]))
        (lp[0] * coef[j, : len(r_ids)]).sum().backward()
    grads = [p.grad.unsqueeze(0) for p in pool["params"]]
    return pool["sketch"](grads)[0]


# ---------------------------------------------------------------------------------------------
# Allocation


def gradient_spread(pool: dict, n: int, g: GVSettings, seed: int):
    """Per prompt, √(n · E‖g_i − E g_i‖²) of its own group's gradient at group size n (groups
    drawn from its pool): the σ_i of the variance Σ σ_i²/n_i, measured rather than guessed."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    rewards = pool["reward"]
    n_prompts, size = rewards.shape
    out = np.zeros(n_prompts)
    for i in range(n_prompts):
        if float(rewards[i].min()) == float(rewards[i].max()):
            continue  # every group's rewards are equal: no gradient at any n
        gs = torch.stack(
            [
                batch_gradient(
                    pool,
                    torch.as_tensor(i * size + rng.integers(0, size, n)),
                    [i] * n,
                    "prompt-mean",
                    g.micro_batch,
                    g.advantage,
                )[0]
                for _ in range(g.oracle_draws)
            ]
        )
        out[i] = math.sqrt(n * float((gs - gs.mean(0)).square().sum(1).mean()))
    return out


def spread_vs_sigma(spread, sigma) -> dict[str, float]:
    """How far ``sigma`` (the Bernoulli σ of each prompt's pool success rate) tells its gradient
    spread: their correlation over prompts with a gradient, and the variance ratio to uniform's
    of unbounded Neyman allocation, (Σ s_i)² / (N Σ s_i²) — the most any allocation could gain."""
    import numpy as np

    live = spread > 0
    varied = live.sum() > 2 and np.ptp(spread[live]) > 0 and np.ptp(sigma[live]) > 0
    corr = float(np.corrcoef(spread[live], sigma[live])[0, 1]) if varied else math.nan
    total = float(np.square(spread).sum())
    ratio = float(spread.sum() ** 2 / (spread.size * total)) if total > 0 else math.nan
    return {"corr": corr, "neyman_var_ratio": ratio}


def neyman_counts(w, total: int, n_min: int, n_max: int):
    """Integers n_i = clip(λ·w_i, n_min, n_max) summing to ``total`` (largest remainders)."""
    import numpy as np

    n = len(w)
    total = int(np.clip(total, n * n_min, n * n_max))
    if not (w > 0).any():
        return np.full(n, total // n) + (np.arange(n) < total % n)
    lo, hi = 0.0, n_max / float(w[w > 0].min())
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.clip(mid * w, n_min, n_max).sum() < total:
            lo = mid
        else:
            hi = mid
    x = np.clip(hi * w, n_min, n_max)
    out = np.floor(x + 1e-9).astype(np.int64)
    left = total - int(out.sum())
    out[np.argsort(-(x - out), kind="stable")[:left]] += 1
    return out


def counts_for(
    name: str,
    stats: dict[str, Any],
    budget_b: int,
    n_prompts: int,
    g: GVSettings,
    oracle: dict[str, Any] | None = None,
    draws=None,
):
    """Counts of allocator ``name`` on ``stats`` (:func:`visit_stats`); ``draws`` feed the skip
    rule."""
    import numpy as np

    from allocator.algorithm import GradStats, allocate_rollouts

    spec, _ = spec_of(name)
    if not spec:
        return np.full(n_prompts, budget_b, dtype=np.int64)
    n_min, n_max = bounds_for(spec, budget_b)
    if spec.get("oracle"):
        return neyman_counts(oracle[spec["oracle"]], budget_b * n_prompts, n_min, n_max)
    params = recipe_allocator().with_overrides(
        {
            "n_min": n_min,
            "n_max": n_max,
            "priority": spec.get("priority", "variance"),
            "scheme": spec.get("scheme", "reference"),
            "method": spec.get("method", "dra"),
            "hopeless_after": g.stat_samples if spec.get("hopeless") else 0,
            "hopeless_n": g.hopeless_n,
            "skip_after": 1 if spec.get("skip") else 0,
        }
    )
    spread = stats["spread_full" if spec.get("full") else "spread"]
    grad = GradStats(spread, np.full(n_prompts, stats["age"]), stats["streak"])
    return allocate_rollouts(
        stats["g"], stats["k"], budget_b * n_prompts, params, grad=grad, skip_draws=draws
    ).counts


def visit_stats(
    pool: dict, g: GVSettings, rng, group: int, age: float, full: bool = True
) -> dict[str, Any]:
    """What the allocator knows at a visit, estimated from the previous visits' groups drawn from
    ``pool``: success counts (G = ``group``, k) and the learner's gradient statistic of the last
    group (:mod:`learner.algorithms.gradstats` on the learner's own loss coefficients,
    prompt-mean), the same spread from the full sketched gradients (``grad-full``; NaN unless
    ``full``: it costs more than the rest), and the zero-advantage streak over the last two
    visits (the skip rule)."""
    import numpy as np
    import torch

    from learner.algorithms.gradstats import group_grad_stats, response_grad_norms

    rewards = pool["reward"].numpy()
    n_prompts, size = rewards.shape
    last = rng.integers(0, size, (n_prompts, group))
    before = rng.integers(0, size, (n_prompts, group))
    rows = np.arange(n_prompts)[:, None]
    k = rewards[rows, last].sum(1)
    idx = torch.as_tensor((rows * size + last).reshape(-1))
    groups = torch.as_tensor(np.repeat(np.arange(n_prompts), group))
    coef = batch_coefficients(pool, idx, groups.tolist(), "prompt-mean", g.micro_batch, g.advantage)
    mask = pool["mask"][idx]
    norm = float(len(set(groups[mask.sum(-1) > 0].tolist()))) or 1.0
    norms = response_grad_norms(coef, pool["ghost"][idx], mask, norm)
    _, _, spread = group_grad_stats(norms, groups)
    spread_full = torch.full((n_prompts,), math.nan)
    if full:
        # Each response's full gradient Σ_t c_t·∇logp_t, read from the sketches without copying
        # them: a sparse [responses, pool tokens] matrix of the coefficients times the sketches.
        t_max = coef.shape[1]
        at = torch.stack(
            [
                torch.arange(len(idx)).repeat_interleave(t_max),
                (idx[:, None] * t_max + torch.arange(t_max)[None]).reshape(-1),
            ]
        )
        flat = pool["grads"].reshape(-1, pool["grads"].shape[-1])
        picks = torch.sparse_coo_tensor(
            at, coef.reshape(-1), (len(idx), flat.shape[0]), check_invariants=False
        )
        full_norms = torch.sparse.mm(picks, flat).norm(dim=1) * norm
        _, _, spread_full = group_grad_stats(full_norms, groups)
    zero_last = (k == 0) | (k == group)
    k_before = rewards[rows, before].sum(1)
    zero_before = (k_before == 0) | (k_before == group)
    return {
        "g": np.full(n_prompts, float(group)),
        "k": k.astype(float),
        "spread": spread.numpy(),
        "spread_full": spread_full.numpy(),
        "streak": zero_last * (1.0 + zero_before),
        "age": age,
    }


def merge_visits(visits: list[dict[str, Any]], revisit: int, half_life: float) -> dict[str, Any]:
    """One statistic of several visits (:func:`visit_stats`, the latest first, visit j made
    j·``revisit`` versions before the latest), merged as the stores merge them with
    ``allocator.stats_half_life`` = ``half_life``: each visit weighs 0.5^(j·revisit/half_life);
    success counts add up weighted (``allocator/stats.py``), the spread is the root of the
    weighted mean of spread² (``dynamo_rl/contracts/gradstats.py``); the streak and age are the
    latest visit's."""
    import numpy as np

    w = [0.5 ** (j * revisit / half_life) for j in range(len(visits))]
    g = sum(wj * v["g"] for wj, v in zip(w, visits, strict=True))
    k = sum(wj * v["k"] for wj, v in zip(w, visits, strict=True))
    sq = sum(wj * np.square(v["spread"]) for wj, v in zip(w, visits, strict=True))
    latest = visits[0]
    return {
        **latest,
        "g": g,
        "k": k,
        "spread": np.sqrt(sq / sum(w)),
        "spread_full": np.full(len(g), math.nan),
    }


def ci(values) -> tuple[float, float]:
    """Mean and 95% half-width (normal approximation)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return float(v.mean()) if v.size else float("nan"), float("nan")
    return float(v.mean()), float(1.96 * v.std(ddof=1) / math.sqrt(v.size))


def measure_checkpoint(
    pool: dict, g: GVSettings, seed: int, stale: dict | None = None, age: int = 0
) -> dict[str, Any]:
    """Every case of one checkpoint; ``stale``: the warm start's pool of the same prompts, whose
    statistics (``age`` weight versions old) the @stale allocators get."""
    import numpy as np
    import torch

    n_prompts, size = pool["reward"].shape
    all_idx = torch.arange(n_prompts * size)
    all_groups = all_idx // size
    refs = {
        w: batch_gradient(pool, all_idx, all_groups, w, g.micro_batch, g.advantage)[0]
        for w in WEIGHTINGS
    }
    t_max = pool["grads"].shape[1]
    flat = pool["grads"].reshape(-1, g.sketch)  # [pool rows × T, sketch], a view
    rewards = pool["reward"].numpy()
    out: dict[str, Any] = {
        "p_mean": float(rewards.mean()),
        "p_per_prompt": rewards.mean(1).tolist(),
        "ref_norm": {w: float(refs[w].norm()) for w in WEIGHTINGS},
        "cases": {},
    }
    p_pool = rewards.mean(1)
    sigma = np.sqrt(p_pool * (1 - p_pool))
    for b in [int(x) for x in g.budgets.split(",")]:
        oracle = {"sigma": sigma}
        if "oracle" in g.allocators.split(","):
            spread = gradient_spread(pool, b, g, seed=seed + b)
            out.setdefault("gradient_spread", {})[f"B{b}"] = spread.tolist()
            out.setdefault("spread_vs_sigma", {})[f"B{b}"] = spread_vs_sigma(spread, sigma)
            oracle["spread"] = spread
        visits: dict[tuple[str, int], dict[str, Any]] = {}

        def stats_at(m: int, variant: str, b: int = b, visits: dict = visits) -> dict[str, Any]:
            """The statistics of batch ``m`` (the same for every allocator of a variant)."""
            if variant.startswith("@h"):  # the visits are shared by every half-life
                history = []
                for j in range(1, g.history + 1):
                    key_j = (f"@visit{j}", m)
                    if key_j not in visits:
                        old = stale is not None and j * g.revisit > age / 2
                        rng = np.random.default_rng([seed, b, m, 8, 2, j])
                        src = stale if old else pool
                        visits[key_j] = visit_stats(src, g, rng, 8, float(g.revisit), False)
                    history.append(visits[key_j])
                return merge_visits(history, g.revisit, float(variant[2:]))
            group = 8 if variant == "@8" else g.stat_samples
            key = (variant, m)
            if key not in visits:
                src, a = (stale, age) if variant == "@stale" else (pool, 0)
                rng = np.random.default_rng([seed, b, m, group, int(variant == "@stale")])
                full = any(
                    spec_of(n)[0].get("full") and spec_of(n)[1] == variant
                    for n in g.allocators.split(",")
                )
                visits[key] = visit_stats(src, g, rng, group, float(a), full)
            return visits[key]

        for name in g.allocators.split(","):
            if spec_of(name)[1] == "@stale" and stale is None:
                continue  # the warm start has no older statistics
            rng = np.random.default_rng([seed, b, sum(map(ord, name))])
            per: dict[str, dict[str, list[float]]] = {w: {"mse": [], "cos": []} for w in WEIGHTINGS}
            # Per batch, the coefficient of every pool token (repeats add up); all the batches'
            # gradients are then one matrix product with the pool's token-gradient sketches.
            coefs = {w: torch.zeros(g.batches, flat.shape[0]) for w in WEIGHTINGS}
            zero_share: list[float] = []
            hopeless_share: list[float] = []
            skip_share: list[float] = []
            for m in range(g.batches):
                st = stats_at(m, spec_of(name)[1])
                k = st["k"]
                counts = counts_for(name, st, b, n_prompts, g, oracle, draws=rng.random(n_prompts))
                skip_share.append(float((counts == 0).mean()))
                idx, groups, zero = [], [], 0
                for i, c in enumerate(counts.tolist()):
                    pick = rng.integers(0, size, c)
                    idx += (i * size + pick).tolist()
                    groups += [i] * c
                    r = rewards[i, pick]
                    if c and (r.min() == r.max()):
                        zero += c
                zero_share.append(zero / max(1, len(idx)))
                hopeless_share.append(float(counts[k == 0].sum()) / max(1, counts.sum()))
                idx_t = torch.tensor(idx)
                tok = (idx_t[:, None] * t_max + torch.arange(t_max)[None]).reshape(-1)
                for w in WEIGHTINGS:
                    coef = batch_coefficients(pool, idx_t, groups, w, g.micro_batch, g.advantage)
                    coefs[w][m].index_add_(0, tok, coef.reshape(-1))
            grads = {w: coefs[w] @ flat for w in WEIGHTINGS}  # [batches, sketch]
            for w in WEIGHTINGS:
                ref = refs[w]
                ref2 = float(ref.square().sum()) or math.nan  # no signal at all: undefined
                per[w]["mse"] = ((grads[w] - ref).square().sum(1) / ref2).tolist()
                per[w]["cos"] = torch.nn.functional.cosine_similarity(
                    grads[w], ref[None], dim=1
                ).tolist()
            case: dict[str, Any] = {
                "zero_adv_share": ci(zero_share),
                "budget_share_on_k0": ci(hopeless_share),
                "skipped_share": ci(skip_share),
            }
            for w in WEIGHTINGS:
                ref2 = float(refs[w].square().sum()) or math.nan
                mean = grads[w].mean(0)
                var = float((grads[w] - mean).square().sum(1).mean()) / ref2
                var *= g.batches / max(1, g.batches - 1)
                case[w] = {
                    "rel_mse": ci(per[w]["mse"]),
                    "rel_var": var,
                    "rel_bias2": float((mean - refs[w]).square().sum()) / ref2,
                    "cos": ci(per[w]["cos"]),
                }
            out["cases"][f"B{b}/{name}"] = case
            print(
                f"  B={b:<3} {name:<14} zero-adv {case['zero_adv_share'][0]:.3f} "
                + " ".join(
                    f"{w}: mse {case[w]['rel_mse'][0]:.3f} cos {case[w]['cos'][0]:.3f}"
                    for w in WEIGHTINGS
                ),
                flush=True,
            )
    # Ratios to uniform (delta-method interval for a ratio of two independent means).
    for key, case in out["cases"].items():
        b, name = key.split("/")
        base = out["cases"][f"{b}/uniform"]
        for w in WEIGHTINGS:
            (m1, h1), (m0, h0) = case[w]["rel_mse"], base[w]["rel_mse"]
            r = m1 / m0 if m0 else math.nan
            half = r * math.hypot(h1 / m1, h0 / m0) if m1 and m0 else math.nan
            case[w]["mse_ratio_to_uniform"] = (r, half)
            v0 = base[w]["rel_var"]
            case[w]["var_ratio_to_uniform"] = case[w]["rel_var"] / v0 if v0 else math.nan
    return out


def chain_rule_check(model, pool: dict, g: GVSettings) -> dict[str, float]:
    """Sketch of a real backward() through the model vs the composed gradient, one small batch."""
    import torch

    n_prompts, size = pool["reward"].shape
    gen = torch.Generator().manual_seed(3)
    idx = torch.cat([i * size + torch.randint(size, (3,), generator=gen) for i in range(n_prompts)])
    groups = (idx // size).tolist()
    res = {}
    for w in WEIGHTINGS:
        composed, _ = batch_gradient(pool, idx, groups, w, g.micro_batch, g.advantage)
        real = true_gradient(model, pool, idx, groups, w, g.micro_batch, g.advantage)
        scale = float(real.norm())
        res[w] = float((composed - real).norm()) / scale if scale else float(composed.norm())
    return res


# ---------------------------------------------------------------------------------------------
# Report


def plot(report: dict, path: Path) -> None:
    """Per checkpoint and weighting, each allocator's MSE ratio to uniform (one bar per budget,
    mean over the prompt sets, whiskers min..max), allocators along the x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report["summary"]
    ckpts = list(summary)
    fig, axes = plt.subplots(len(ckpts), 2, figsize=(13, 4.2 * len(ckpts)), squeeze=False)
    for row, ck in enumerate(ckpts):
        cases = summary[ck]
        budgets = sorted({int(k.split("/")[0][1:]) for k in cases})
        names = [
            n for n in report["allocators"] if n != "uniform" and f"B{budgets[0]}/{n}" in cases
        ]
        width = 0.8 / len(budgets)
        for col, w in enumerate(WEIGHTINGS):
            ax = axes[row][col]
            for j, b in enumerate(budgets):
                vals = [cases[f"B{b}/{n}"][w] for n in names]
                mean = [v["mse_ratio_mean"] for v in vals]
                err = [
                    [m - v["mse_ratio_range"][0] for m, v in zip(mean, vals, strict=True)],
                    [v["mse_ratio_range"][1] - m for m, v in zip(mean, vals, strict=True)],
                ]
                xs = [i + (j - (len(budgets) - 1) / 2) * width for i in range(len(names))]
                ax.bar(xs, mean, width, yerr=err, label=f"B={b}")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.axhline(0.80, color="r", lw=0.8, ls="--")
            ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
            ax.set_ylabel("MSE / uniform's")
            ax.set_title(f"{ck}, {w}")
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    fig.suptitle(
        "Batch-gradient MSE to the reference, allocator / uniform at equal budget "
        f"(mean over {len(report['sets'])} prompt sets, whiskers: min..max; red: 0.80)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv: list[str] | None):
    from sample_efficiency import Settings

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny smoke settings")
    p.add_argument("--out", default=None, help="output stem (default results/grad_variance)")
    p.add_argument("--cache", default=os.environ.get("GV_CACHE", "/tmp/dynamo_gv_cache"))
    p.add_argument(
        "--merge",
        default=None,
        help="comma-separated JSON reports of runs over other prompt sets (same settings "
        "otherwise, e.g. run in parallel with --prompt-offset): write one report of all their "
        "sets to --out instead of measuring",
    )
    for f in GVSettings.__dataclass_fields__.values():
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None)
    args = p.parse_args(argv)
    # The quickstart's warm start (its tiers include hard), as benchmarks/sample_efficiency.py
    # builds it.
    s = Settings(warm_tiers="easy,medium,medium-rev,medium-sub,hard")
    g = GVSettings()
    if args.quick:
        s = Settings(task_train=400, test_prompts=50, warm_steps=20, warm_tiers="easy,medium")
        g = GVSettings(
            prompts=4,
            pool=8,
            rl_steps="0,2",
            budgets="2,4",
            batches=4,
            sketch=256,
            stat_samples=4,
            oracle_draws=4,
            prompt_sets=2,
            rl_batch=4,
            rl_n=4,
        )
    for name in GVSettings.__dataclass_fields__:
        v = getattr(args, name, None)
        if v is not None:
            setattr(g, name, v)
    if g.half_lives:
        extra = [f"{m}@h{h}" for h in g.half_lives.split(",") for m in ("grad", "dra")]
        g.allocators = ",".join([*g.allocators.split(","), *extra])
    if g.prompt_sets < 1:
        p.error(f"--prompt-sets {g.prompt_sets}: must be >= 1")
    if g.advantage not in ADVANTAGES:
        p.error(f"--advantage {g.advantage!r}: allowed: {', '.join(ADVANTAGES)}")
    chosen = g.allocators.split(",")
    unknown = [n for n in chosen if not _known(n)]
    if unknown or "uniform" not in chosen:
        p.error(
            f"--allocators {g.allocators!r}: must include uniform; allowed: {', '.join(ALLOCATORS)}"
            f" (runnable ones with {', '.join(VARIANTS)} or @h<half-life>)"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    return args, s, g


def _known(name: str) -> bool:
    try:
        spec_of(name)
    except KeyError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    import torch
    from sample_efficiency import load, task_rows, warm_start

    torch.set_num_threads(1)
    args, s, g = parse(argv)
    if args.merge:
        return merge(
            args.merge.split(","), Path(args.out) if args.out else RESULTS / "grad_variance"
        )
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    warm = warm_start(s, cache)
    train = task_rows(s)[0]
    offsets = [g.prompt_offset + j * g.prompts for j in range(g.prompt_sets)]
    if offsets[-1] + g.prompts > len(train):
        raise SystemExit(
            f"--prompt-offset {g.prompt_offset} + --prompt-sets {g.prompt_sets} × --prompts "
            f"{g.prompts} is past the {len(train)} train prompts"
        )
    report: dict[str, Any] = {
        "what": "batch-gradient error at equal budget, allocator vs uniform (module docstring)",
        "settings": asdict(g),
        "task_settings": asdict(s),
        "allocators": {n: spec_of(n)[0] for n in g.allocators.split(",")},
        "recipe_allocator": recipe_allocator().model_dump(),
        "sets": [],
    }
    steps_list = [int(x) for x in g.rl_steps.split(",")]
    checkpoints = {steps: rl_checkpoint(s, g, warm, steps, cache) for steps in steps_list}
    for offset in offsets:
        rows = train[offset : offset + g.prompts]
        result: dict[str, Any] = {"prompt_offset": offset, "checkpoints": {}}
        warm_pool = None
        for steps, ck in checkpoints.items():
            model, tok = load(ck)
            name = "warm start" if steps == 0 else f"RL step {steps}"
            print(
                f"== prompts {offset}..{offset + g.prompts - 1}, {name}: the pool "
                f"({g.prompts} × {g.pool})",
                flush=True,
            )
            seed = g.seed * 7919 + steps
            pool_file = (
                cache / f"pool-{ck.name}-{offset}+{g.prompts}x{g.pool}-sk{g.sketch}-s{seed}-gh.pt"
            )
            pool = build_pool(model, tok, rows, g, s, seed=seed, cache_file=pool_file)
            res = measure_checkpoint(pool, g, seed=seed, stale=warm_pool, age=steps)
            res["chain_rule_check"] = chain_rule_check(model, pool, g)
            if steps == 0:
                warm_pool = pool
            print(f"  p mean {res['p_mean']:.3f}; chain-rule check {res['chain_rule_check']}")
            result["checkpoints"][name] = res
            del pool
        report["sets"].append(result)
    report["summary"] = summarise(report["sets"])
    report["wall_s"] = time.time() - t0
    default = cache / "quick" / "grad_variance" if args.quick else RESULTS / "grad_variance"
    out = Path(args.out) if args.out else default
    write_report(report, out)
    return 0


def merge(paths: list[str], out: Path) -> int:
    """One report of several runs' prompt sets (the first run's settings, its sets first)."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    report = reports[0]
    report["sets"] = [st for r in reports for st in r["sets"]]
    report["settings"]["prompt_sets"] = len(report["sets"])
    report["wall_s"] = sum(r["wall_s"] for r in reports)
    report["merged_from"] = [Path(p).name for p in paths]
    # Each part's machine (the merged report's "machine" is the one that merged them).
    report["merged_machines"] = [r.get("machine") for r in reports]
    report["summary"] = summarise(report["sets"])
    write_report(report, out)
    return 0


def write_report(report: dict, out: Path) -> None:
    write_result(out.with_suffix(".json"), report, indent=1)
    plot(report, out.with_suffix(".png"))
    print_table(report)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


def summarise(sets: list[dict]) -> dict[str, Any]:
    """Per checkpoint, case and weighting: the MSE and variance ratios to uniform of every prompt
    set, and their mean, min and max."""
    out: dict[str, Any] = {}
    for ck, res in sets[0]["checkpoints"].items():
        for key in res["cases"]:
            case: dict[str, Any] = {}
            for w in WEIGHTINGS:
                mse = [
                    st["checkpoints"][ck]["cases"][key][w]["mse_ratio_to_uniform"][0] for st in sets
                ]
                var = [
                    st["checkpoints"][ck]["cases"][key][w]["var_ratio_to_uniform"] for st in sets
                ]
                oracle = [
                    st["checkpoints"][ck]["cases"].get(key.split("/")[0] + "/oracle") for st in sets
                ]
                share = [
                    (1 - r) / (1 - o[w]["mse_ratio_to_uniform"][0])
                    if o and o[w]["mse_ratio_to_uniform"][0] < 1
                    else math.nan
                    for r, o in zip(mse, oracle, strict=True)
                ]
                case[w] = {
                    "mse_ratio": mse,
                    "mse_ratio_mean": sum(mse) / len(mse),
                    "oracle_share": share,
                    "mse_ratio_range": [min(mse), max(mse)],
                    "var_ratio": var,
                    "var_ratio_mean": sum(var) / len(var),
                }
            case["zero_adv_share"] = [
                st["checkpoints"][ck]["cases"][key]["zero_adv_share"][0] for st in sets
            ]
            out.setdefault(ck, {})[key] = case
    return out


def print_table(report: dict) -> None:
    for st in report["sets"]:
        print(
            f"\nprompts {st['prompt_offset']}.. | checkpoint | B | allocator | zero-adv share | "
            + " | ".join(f"{w} rel. MSE | {w} MSE ratio | {w} cos" for w in WEIGHTINGS)
            + " |"
        )
        for ck, res in st["checkpoints"].items():
            for key, c in res["cases"].items():
                b, name = key.split("/")
                cells = [f"{c['zero_adv_share'][0]:.3f} ± {c['zero_adv_share'][1]:.3f}"]
                for w in WEIGHTINGS:
                    m, r, cs = c[w]["rel_mse"], c[w]["mse_ratio_to_uniform"], c[w]["cos"]
                    cells += [
                        f"{m[0]:.3f} ± {m[1]:.3f}",
                        f"{r[0]:.2f} ± {r[1]:.2f}",
                        f"{cs[0]:.3f} ± {cs[1]:.3f}",
                    ]
                print(f"| {ck} | {b[1:]} | {name} | " + " | ".join(cells) + " |")
    print(
        "\nMSE / uniform's per prompt set (mean) | checkpoint | B | allocator | "
        + " | ".join(WEIGHTINGS)
        + " |"
    )
    for ck, cases in report["summary"].items():
        for key, c in cases.items():
            b, name = key.split("/")
            cells = [
                " / ".join(f"{r:.2f}" for r in c[w]["mse_ratio"])
                + f" ({c[w]['mse_ratio_mean']:.2f})"
                for w in WEIGHTINGS
            ]
            print(f"| {ck} | {b[1:]} | {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
