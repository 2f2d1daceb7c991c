"""Sample efficiency of DynaMO against uniform GRPO on the built-in ``arith`` task, in-process.

Every method gets the same rollout budget per step (``batch_size`` prompts × ``n`` responses) and
starts from the same warm-started checkpoint; each step is one on-policy update. Methods:

- ``grpo``          uniform n per prompt, GRPO advantages, PPO-clip loss (the baseline);
- ``alloc``         DynaMO allocation only: counts from ``allocator.allocate_rollouts`` (scheme
                    ``reference``, priority ``variance``, statistics decay 1.0), grpo's loss
                    aggregated by ``--alloc-agg`` (default prompt-mean, as the shipped recipe);
- ``mod``           DynaMO modulation only: uniform counts, ``dynamo_modulate`` (preset decay6) on
                    the GRPO advantages before the loss, per micro-batch as in the learner;
- ``dynamo``        both (allocation and aggregation as in ``alloc``, modulation as in ``mod``);
- ``dynamo-wl-std`` both, allocator scheme ``water-level`` with priority ``std`` (n ∝ σ);
- ``dynamo-decay``  both, statistics decay ``--decay`` (default 0.9);
- ``uniform``       uniform n like ``grpo`` but under prompt-mean: the control for allocation alone
                    (``--baseline uniform`` pairs every method with it);
- ``alloc-wide``    ``alloc`` in the range 2..2n instead of ``--n-min``..``--n-max``;
- ``grad``          allocation method ``grad`` (n ∝ the gradient spread each prompt's last group
                    gave, measured in this loop's own backward as the learner measures it;
                    ``learner/algorithms/gradstats.py``), no modulation, prompt-mean;
- ``grad-wide``     ``grad`` in the range 2..2n; ``grad-wide-hl16`` the same with
                    ``grad_half_life`` 16 instead of the allocator's 4.

The summary gives, per method, 95% Student-t intervals over seeds of the final accuracy, of the
rollouts to the target (over the seeds that reached it) and of the paired differences to the
baseline (``--baseline``, default ``grpo``) seed by seed (final accuracy, mean of the evaluation
curve, rollouts to target, and the ratio of rollouts to target).

The methods run **in this process, not through the distributed services**: the same allocator
function (``allocate_rollouts``), the learner's own RL step (``learner.step.RLStep``, the one
the learner runs: its old pass, advantages, modulation and loss per micro-batch of
``micro_batch`` rows with the whole batch's normaliser, logits divided by the sampling
temperature, its gradient statistics for method ``grad``, its AdamW step) and the reward
service's math scorer (``score_math`` in ``last_boxed``
mode, called in-process with a memo cache) as the services use — but generation is
``model.generate`` on the policy itself and the per-prompt statistics live in a dict updated with
the allocator's Redis semantics (on every report: samples, successes ← decay·old + new). Running the
services (Redis, allocator, reward workers, an engine, the learner under torchrun) for 18 runs does
not fit the 2 shared CPU cores this benchmark was measured on; the in-process loop measures the
algorithm, not the plumbing.

Statistics are updated online after every scored group, before the next step's allocation. Each
(method, seed) run is one child process writing one JSON file into the cache folder, so an
interrupted benchmark resumes where it stopped. The outputs (``--out``) are a JSON file with all
curves, per-step logs and the summary, and a PNG of held-out accuracy against rollouts consumed.

    .venv/bin/python benchmarks/sample_efficiency.py --quick          # smoke run, ~10 min on 2 loaded cores
    .venv/bin/python benchmarks/sample_efficiency.py                  # full benchmark
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from _machine import write_result  # noqa: E402 - the result file, with its machine

RESULTS = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class MethodSpec:
    """One compared method: how rollouts are allocated and whether advantages are modulated."""

    allocate: bool
    modulate: bool
    scheme: str = "reference"
    priority: str = "variance"
    decay: float = 1.0
    method: str = "dra"
    """The allocator's method (``allocator.method``): dra, or grad on the statistic this loop
    measures in its own backward, as the learner does."""
    wide: bool = False
    """Range 2..2n instead of ``n_min``..``n_max`` (``grad_variance.py``'s ``-wide``)."""
    agg: str | None = None
    """Loss aggregation; None: ``alloc_agg`` when the method allocates, else token-mean."""
    half_life: float = 4.0
    """grad: ``allocator.grad_half_life`` (default the allocator's). A prompt's statistic is
    ``train_prompts / batch_size`` weight versions old when the prompt comes round again."""


def method_specs(decay: float) -> dict[str, MethodSpec]:
    return {
        "grpo": MethodSpec(allocate=False, modulate=False),
        "alloc": MethodSpec(allocate=True, modulate=False),
        "mod": MethodSpec(allocate=False, modulate=True),
        "dynamo": MethodSpec(allocate=True, modulate=True),
        "dynamo-wl-std": MethodSpec(
            allocate=True, modulate=True, scheme="water-level", priority="std"
        ),
        "dynamo-decay": MethodSpec(allocate=True, modulate=True, decay=decay),
        # Allocation alone under the recipe's prompt-mean, against uniform n under the same
        # weighting (``--baseline uniform``).
        "uniform": MethodSpec(allocate=False, modulate=False, agg="prompt-mean"),
        "alloc-wide": MethodSpec(allocate=True, modulate=False, wide=True),
        "grad": MethodSpec(allocate=True, modulate=False, method="grad"),
        "grad-wide": MethodSpec(allocate=True, modulate=False, method="grad", wide=True),
        "grad-wide-hl16": MethodSpec(
            allocate=True, modulate=False, method="grad", wide=True, half_life=16.0
        ),
    }


def method_agg(spec: MethodSpec, s: Settings) -> str:
    """The loss aggregation of a method: its own, else ``s.alloc_agg`` when it allocates, else
    token-mean."""
    if spec.agg is not None:
        return spec.agg
    return s.alloc_agg if spec.allocate else "token-mean"


def method_algo(spec: MethodSpec, s: Settings):
    """The learner's algorithm of a method's update: PPO-clip with dual clip, no KL, no entropy
    bonus, no IS correction (one on-policy update per batch), the method's aggregation and
    modulation."""
    from dynamo_rl.config.learner import AlgorithmConfig, ModulationConfig, PpoLoss

    return AlgorithmConfig(
        policy_loss=PpoLoss(clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=10.0),
        agg=method_agg(spec, s),
        modulation=ModulationConfig(enabled=spec.modulate, preset=s.preset),
        is_cap=None,
    )


def method_bounds(spec: MethodSpec, s: Settings) -> tuple[int, int]:
    """(n_min, n_max) of a method that allocates: 2..2n when ``wide``, else the settings'."""
    return (2, 2 * s.n) if spec.wide else (s.n_min, s.n_max)


@dataclass
class Settings:
    """Everything a run depends on (hashed into the cache key)."""

    # task
    task_seed: int = 0
    task_train: int = 3512
    """Train rows drawn; the warm start uses those of ``warm_tiers``."""
    train_prompts: int = 256
    """RL prompt pool: the first rows of the train split (several epochs, so statistics matter)."""
    test_prompts: int = 1000
    # model and warm start
    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    warm_steps: int = 500
    warm_batch: int = 64
    warm_lr: float = 1e-3
    warm_weight_decay: float = 0.1
    warm_seed: int = 1
    warm_tiers: str = "easy,medium,medium-rev,medium-sub"
    """Comma-separated task tiers of the warm start (the quickstart adds ``hard``)."""
    # RL
    steps: int = 64
    batch_size: int = 16
    n: int = 8
    n_min: int = 4
    n_max: int = 16
    initial_budget: int = 8
    mastery_threshold: float = 0.85
    min_priority: float = 0.01
    lr: float = 2e-4
    clip_low: float = 0.2
    clip_high: float = 0.28
    grad_clip: float = 1.0
    preset: str = "decay6"
    micro_batch: int = 8
    """Rows per micro-batch (the learner's default ``micro_batch_size``): each is one forward
    pass and one call of the learner's objective, so modulation statistics are per micro-batch;
    gradients accumulate to one optimizer step per RL step."""
    temperature: float = 1.0
    max_new_tokens: int = 12
    # evaluation
    eval_every: int = 8
    eval_subset: int = 500
    decay: float = 0.9
    alloc_agg: str = "prompt-mean"
    """Loss aggregation of the methods that allocate (``alloc``, ``dynamo*``): the shipped DynaMO
    recipe's ``prompt-mean`` (every prompt's group weighs the same whatever its n), or
    ``token-mean`` (the first committed figures); the others use token-mean."""
    extra: dict[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def warm_key(self) -> str:
        d = asdict(self)
        keep = ["task_seed", "task_train", "test_prompts", "hidden_size", "layers", "heads"]
        keep += [
            "kv_heads",
            "warm_steps",
            "warm_batch",
            "warm_lr",
            "warm_weight_decay",
            "warm_seed",
            "warm_tiers",
        ]
        return hashlib.sha256(json.dumps({k: d[k] for k in keep}).encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# Task, scoring


def task_rows(s: Settings) -> tuple[list[dict], list[dict], list[dict]]:
    """(RL train pool, SFT pool of the warm-start tiers, held-out test rows); test is disjoint."""
    from tasks.arith import generate_rows

    train, test = generate_rows(s.task_train, s.test_prompts, seed=s.task_seed)
    rl_pool = train[: s.train_prompts]
    tiers = s.warm_tiers.split(",")
    # medium-sub rows last: the order the committed results were produced with.
    sft = [
        r
        for r in train
        if r["extra_info"]["tier"] in tiers and r["extra_info"]["tier"] != "medium-sub"
    ]
    sft += [r for r in train if r["extra_info"]["tier"] == "medium-sub" and "medium-sub" in tiers]
    return rl_pool, sft, test


_CANONICAL_INT = re.compile(r"-?(0|[1-9][0-9]*)")
SCORER_CALLS = {"fast": 0, "math_verify": 0}


@lru_cache(maxsize=200_000)
def is_correct(response: str, ground_truth: str) -> bool:
    """The reward service's ``last_boxed`` verdict, memoised (responses repeat a lot).

    The answer is extracted with the service's own ``extract_last_boxed``. When both it and the
    ground truth are canonical integers (no sign but a leading minus, no leading zeros — nearly
    every response of this task) math-verify's verdict is plain equality of the strings, so that
    is used; anything else goes through the service's ``score_math`` (math-verify) in-process.
    """
    from services.reward.math_answer import extract_last_boxed, score_math

    answer = extract_last_boxed(response)
    if answer is None:
        SCORER_CALLS["fast"] += 1
        return False
    if _CANONICAL_INT.fullmatch(answer) and _CANONICAL_INT.fullmatch(ground_truth):
        SCORER_CALLS["fast"] += 1
        return answer == ground_truth
    SCORER_CALLS["math_verify"] += 1
    return bool(score_math(response, ground_truth, "last_boxed")["correct"])


def prompt_text(row: dict) -> str:
    from dynamo_rl.prompts import render_plain

    return render_plain(row["prompt"])


# ---------------------------------------------------------------------------------------------
# Model helpers


def load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype="float32")
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    return model, tok


def warm_start(s: Settings, cache: Path) -> Path:
    """Build the tiny model and train it on reference answers of the warm-start tiers (cached)."""
    import torch

    from learner.tiny_model import build_tiny_model

    out = cache / f"warm-{s.warm_key()}"
    if (out / "done").exists():
        return out
    torch.set_num_threads(1)
    build_tiny_model(
        out,
        hidden_size=s.hidden_size,
        num_layers=s.layers,
        num_heads=s.heads,
        num_kv_heads=s.kv_heads,
        seed=s.task_seed,
    )
    model, tok = load(out)
    _, sft, _ = task_rows(s)
    texts = [(prompt_text(r), r["extra_info"]["answer"]) for r in sft]
    encoded = []
    for p, a in texts:
        pi = tok.encode(p)
        ai = [*tok.encode(a), tok.eos_token_id]
        encoded.append((pi, ai))
    opt = torch.optim.AdamW(model.parameters(), lr=s.warm_lr, weight_decay=s.warm_weight_decay)
    gen = torch.Generator().manual_seed(s.warm_seed)
    model.train()
    t0 = time.time()
    for step in range(s.warm_steps):
        idx = torch.randint(len(encoded), (s.warm_batch,), generator=gen).tolist()
        seqs = [encoded[i][0] + encoded[i][1] for i in idx]
        width = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), width), tok.pad_token_id)
        labels = torch.full((len(seqs), width), -100)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, i in enumerate(idx):
            p, a = encoded[i]
            ids[b, : len(p) + len(a)] = torch.tensor(p + a)
            labels[b, len(p) : len(p) + len(a)] = torch.tensor(a)
            attn[b, : len(p) + len(a)] = 1
        for g in opt.param_groups:  # short linear warm-up, then constant
            g["lr"] = s.warm_lr * min(1.0, (step + 1) / 50)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 200 == 0 or step == s.warm_steps - 1:
            print(f"[warm] step {step} loss {loss.item():.4f} {time.time() - t0:.0f}s", flush=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "done").write_text("ok\n")
    return out


def generate(
    model, tok, prompts: list[str], *, greedy: bool, s: Settings, chunk: int = 512,
    logprobs: bool = False,
):  # fmt: skip
    """Left-padded generation; per chunk ``(sequences [B, P+T], prompt width P, prompt attention
    [B, P])``, plus with ``logprobs`` each sampled token's log-prob ``[B, T]`` under the
    distribution it was drawn from (the tempered one: what an engine reports)."""
    import torch

    outs = []
    for i in range(0, len(prompts), chunk):
        enc = tok(prompts[i : i + chunk], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=not greedy,
                temperature=s.temperature if not greedy else None,
                top_k=0 if not greedy else None,
                top_p=1.0 if not greedy else None,
                max_new_tokens=s.max_new_tokens,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                output_scores=logprobs,
                return_dict_in_generate=True,
            )
        width = enc["input_ids"].shape[1]
        item = (out.sequences, width, enc["attention_mask"])
        if logprobs:
            scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)
            item += (scores.gather(-1, out.sequences[:, width:, None]).squeeze(-1),)
        outs.append(item)
    return outs


def response_mask(resp, eos_id: int):
    """1 up to and including the first EOS (generate pads after it)."""
    import torch

    is_eos = resp == eos_id
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()  # EOS seen strictly before
    return (before == 0).long()


def decode_responses(tok, resp, mask) -> list[str]:
    out = []
    for row, m in zip(resp.tolist(), mask.tolist(), strict=True):
        ids = [t for t, keep in zip(row, m, strict=True) if keep and t != tok.eos_token_id]
        out.append(tok.decode(ids, skip_special_tokens=True))
    return out


def evaluate(model, tok, rows: list[dict], s: Settings, seed: int) -> dict[str, float]:
    """Greedy and sampled (temperature 1, one sample) accuracy on ``rows``."""
    import torch

    model.eval()
    prompts = [prompt_text(r) for r in rows]
    gts = [r["reward_model"]["ground_truth"] for r in rows]
    res = {}
    for name, greedy in (("greedy", True), ("sampled", False)):
        torch.manual_seed(10_000_019 * (seed + 1) + 7)  # same eval sampling noise at every point
        correct = 0
        k = 0
        for seq, width, _ in generate(model, tok, prompts, greedy=greedy, s=s):
            resp = seq[:, width:]
            texts = decode_responses(tok, resp, response_mask(resp, tok.eos_token_id))
            correct += sum(
                is_correct(t, g) for t, g in zip(texts, gts[k : k + len(texts)], strict=True)
            )
            k += len(texts)
        res[name] = correct / len(rows)
    return res


# ---------------------------------------------------------------------------------------------
# One RL run


def learner_config(
    s: Settings, algo, *, groups: int, lr: float | None = None, epochs: int = 1,
    mini_batches: int = 1, micro: int | None = None,
):  # fmt: skip
    """The learner's config of this benchmark's update: ``groups`` groups a batch in
    ``mini_batches`` optimizer steps (whole groups each) for ``epochs`` passes, micro-batches of
    ``micro`` rows (default ``s.micro_batch``), AdamW at ``lr`` (default ``s.lr``) with
    ``s.grad_clip``."""
    import math

    from dynamo_rl.config.learner import LearnerConfig, OptimConfig

    return LearnerConfig(
        lr=s.lr if lr is None else lr,
        train_batch_size=groups,
        mini_batch_size=max(1, math.ceil(groups / mini_batches)),
        micro_batch_size=micro or s.micro_batch,
        ppo_epochs=epochs,
        optim=OptimConfig(grad_clip=s.grad_clip),
        algorithm=algo,
    )


def learner_step(model, tok, lc, *, grad_stats: bool = False):
    """The learner's RL step (``learner.step.RLStep``) on ``model``, with the learner's AdamW:
    every update of this benchmark and of those that import it is that step."""
    from learner.model import PolicyModel
    from learner.step import RLStep, adamw

    policy = PolicyModel(model)
    return RLStep(lc, policy, adamw(policy, lc), pad_id=tok.pad_token_id, grad_stats=grad_stats)


def sampled_batch(
    model, tok, s: Settings, rows: list[dict], group_of: list[int], prompt_ids: list[str]
):  # fmt: skip
    """Sample a response for every entry of ``group_of`` (the prompt of ``rows[group]``, named
    ``prompt_ids[group]``) at ``s.temperature`` and score it: the step's batch and the rewards
    ``[len(group_of)]``."""
    import torch

    prompts = [prompt_text(rows[g]) for g in group_of]
    gts = [rows[g]["reward_model"]["ground_truth"] for g in group_of]
    ((seq, width, attn, logp),) = generate(
        model, tok, prompts, greedy=False, s=s, chunk=10**9, logprobs=True
    )
    rmask = response_mask(seq[:, width:], tok.eos_token_id)
    texts = decode_responses(tok, seq[:, width:], rmask)
    rewards = torch.tensor([float(is_correct(t, g)) for t, g in zip(texts, gts, strict=True)])
    batch = rl_batch(seq, width, attn, rmask, logp, rewards, group_of, prompt_ids, s.temperature)
    return batch, rewards


def rl_batch(
    seq, width: int, prompt_attn, rmask, sampling_logp, rewards, group_of: list[int],
    prompt_ids: list[str], temperature: float,
):  # fmt: skip
    """The step's input from a generated batch: row ``j`` is a sample of group ``group_of[j]``
    (prompt ``prompt_ids[group]``), its prompt the unpadded prompt tokens, its response the
    tokens up to and including EOS (``rmask``), with their sampling log-probs and its reward."""
    from learner.batch import Sample
    from learner.step import RLBatch

    samples = []
    for j, g in enumerate(group_of):
        n = int(rmask[j].sum())
        samples.append(
            Sample(
                prompt=seq[j, :width][prompt_attn[j].bool()].tolist(),
                response=seq[j, width : width + n].tolist(),
                sampling_logprobs=sampling_logp[j, :n].tolist(),
                reward=float(rewards[j]),
                correct=bool(rewards[j] > 0),
                group=g,
                temperature=temperature if temperature > 0 else 1.0,
            )
        )
    return RLBatch(samples=samples, prompt_ids=prompt_ids)


UPDATE_FIELDS = (
    "grad_norm",
    "entropy",
    "beta_comp_mean",
    "beta_stab_mean",
    "multiplier_mean",
    "clip_frac_upper",
    "clip_frac_lower",
    "clip_frac_dual",
    "ratio_mean",
    "approx_kl",
)
"""The step record's fields each step's log keeps."""


def run_one(method: str, seed: int, s: Settings, warm: Path, out_file: Path) -> None:
    import numpy as np
    import torch

    from allocator.algorithm import GradStats, allocate_rollouts
    from dynamo_rl.contracts.allocator import AllocationParams

    torch.set_num_threads(1)
    spec = method_specs(s.decay)[method]
    rl_pool, _, test = task_rows(s)
    eval_rows = test[: s.eval_subset]
    model, tok = load(warm)
    step_fn = learner_step(
        model,
        tok,
        learner_config(s, method_algo(spec, s), groups=s.batch_size),
        grad_stats=spec.method == "grad",
    )
    rng = np.random.default_rng(seed)  # prompt order: a function of the seed only
    samples = np.zeros(len(rl_pool))
    successes = np.zeros(len(rl_pool))
    # The learner's statistics per prompt (method grad): spread at its last visit (NaN: never
    # measured), the step whose update measured it, and its zero-advantage streak (kept with
    # the success counts below).
    spread = np.full(len(rl_pool), np.nan)
    measured_at = np.zeros(len(rl_pool))
    streak = np.zeros(len(rl_pool))
    order: list[int] = []
    curve = []
    log = []
    consumed = 0
    zero_adv_rollouts = 0
    t_start = time.time()

    def record(step: int, rows: list[dict]) -> None:
        acc = evaluate(model, tok, rows, s, seed)
        curve.append({"step": step, "rollouts": consumed, **acc})
        print(
            f"[{method} s{seed}] step {step} rollouts {consumed} greedy {acc['greedy']:.3f} "
            f"sampled {acc['sampled']:.3f} ({time.time() - t_start:.0f}s)",
            flush=True,
        )

    record(0, eval_rows)
    n_min, n_max = method_bounds(spec, s)
    params = AllocationParams(
        priority=spec.priority,
        scheme=spec.scheme,
        method=spec.method,
        grad_half_life=spec.half_life,
        n_min=n_min,
        n_max=n_max,
        **{k: getattr(s, k) for k in ("initial_budget", "mastery_threshold", "min_priority")},
    )
    for step in range(1, s.steps + 1):
        if len(order) < s.batch_size:
            order += rng.permutation(len(rl_pool)).tolist()
        batch, order = order[: s.batch_size], order[s.batch_size :]
        budget = s.batch_size * s.n
        if spec.allocate:
            # A statistic measured by step t's update is (step − t) weight versions old now.
            grad = GradStats(spread[batch], step - measured_at[batch], streak[batch])
            counts = allocate_rollouts(
                samples[batch], successes[batch], budget, params, grad=grad
            ).counts.tolist()
        else:
            counts = [s.n] * s.batch_size
        assert sum(counts) == budget
        group_of = [g for g, c in enumerate(counts) for _ in range(c)]
        model.eval()
        torch.manual_seed(seed * 1_000_003 + step)
        step_batch, rewards = sampled_batch(
            model, tok, s, [rl_pool[i] for i in batch], group_of, [str(i) for i in batch]
        )

        # Online statistics, one report per scored group (allocator semantics: decay·old + new).
        zero_groups = 0
        for g, c in enumerate(counts):
            r = rewards[[i for i, gg in enumerate(group_of) if gg == g]]
            k = float(r.sum())
            i = batch[g]
            samples[i] = samples[i] * spec.decay + c
            successes[i] = successes[i] * spec.decay + k
            zero = k in (0.0, float(c))
            streak[i] = streak[i] + 1 if zero else 0
            if zero:
                zero_groups += 1
                zero_adv_rollouts += c
        consumed += budget

        model.train()
        result = step_fn(step_batch)
        # What the learner reports to the allocator after its step (method grad).
        for rec in result.grad_records:
            spread[int(rec.prompt_id)], measured_at[int(rec.prompt_id)] = rec.spread, step
        stats = {k: result.record[k] for k in UPDATE_FIELDS if k in result.record}
        log.append(
            {
                "step": step,
                "rollouts": consumed,
                "reward": float(rewards.mean()),
                "zero_adv_groups": zero_groups,
                "counts": counts,
                "counts_min": min(counts),
                "counts_max": max(counts),
                **stats,
            }
        )
        if step % s.eval_every == 0 or step == s.steps:
            record(step, eval_rows)

    final = evaluate(model, tok, test, s, seed + 1000) if s.eval_subset < len(test) else None
    out_file.write_text(
        json.dumps(
            {
                "method": method,
                "seed": seed,
                "curve": curve,
                "final_full": final or {k: curve[-1][k] for k in ("greedy", "sampled")},
                "rollouts": consumed,
                "zero_adv_rollouts": zero_adv_rollouts,
                "log": log,
                "wall_s": time.time() - t_start,
                "scorer_calls": dict(SCORER_CALLS),
            }
        )
    )


# ---------------------------------------------------------------------------------------------
# Summary


def rollouts_to_reach(
    curve_x: list[float], curve_y: list[float], target: float | None
) -> float | None:
    """First rollout count where the (linearly interpolated) curve reaches ``target`` (None: no
    target, nothing reached)."""
    if target is None:
        return None
    for i, y in enumerate(curve_y):
        if y >= target:
            if i == 0:
                return curve_x[0]
            x0, x1, y0 = curve_x[i - 1], curve_x[i], curve_y[i - 1]
            return x0 + (x1 - x0) * (target - y0) / (y - y0)
    return None


# Two-sided 97.5% quantiles of Student's t by degrees of freedom (no scipy in the environment).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
         16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}  # fmt: skip


def t_interval(values: list[float]) -> dict[str, Any]:
    """Mean and 95% Student-t interval over ``values`` (seeds): ``{"mean", "ci", "n"}``; the
    interval is ``[nan, nan]`` with fewer than two values."""
    import math

    import numpy as np

    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return {"mean": None, "ci": [float("nan")] * 2, "n": 0}
    mean = float(v.mean())
    if v.size < 2:
        return {"mean": mean, "ci": [float("nan")] * 2, "n": 1}
    df = v.size - 1
    q = _T975[max(k for k in _T975 if k <= df)]  # conservative between tabulated df
    half = q * float(v.std(ddof=1)) / math.sqrt(v.size)
    return {"mean": mean, "ci": [mean - half, mean + half], "n": int(v.size)}


def paired(a: dict[int, float | None], b: dict[int, float | None]) -> dict[str, Any]:
    """t interval of ``a[seed] − b[seed]`` over the seeds where both are defined."""
    seeds = sorted(k for k in a if k in b and a[k] is not None and b[k] is not None)
    return {**t_interval([a[k] - b[k] for k in seeds]), "seeds": seeds}


def summarise(
    runs: list[dict], methods: list[str], metric: str, target_frac: float, baseline: str = "grpo"
) -> dict:
    """Per method: final accuracy, rollouts to the target and the paired differences to
    ``baseline`` seed by seed; the target is start + ``target_frac`` × the baseline's mean gain."""
    import numpy as np

    by = {
        m: sorted((r for r in runs if r["method"] == m), key=lambda r: r["seed"]) for m in methods
    }
    x = [p["rollouts"] for p in by[baseline][0]["curve"]]
    mean = {m: np.mean([[p[metric] for p in r["curve"]] for r in by[m]], axis=0) for m in methods}
    start = float(np.mean([mean[m][0] for m in methods]))
    base_final = float(mean[baseline][-1])
    # No target when the baseline's seed-mean curve did not gain: "rollouts to reach a loss"
    # means nothing.
    target = start + target_frac * (base_final - start) if base_final > start else None

    def per_seed_reach(r: dict) -> float | None:
        return rollouts_to_reach(x, [p[metric] for p in r["curve"]], target)

    base_reach = {r["seed"]: per_seed_reach(r) for r in by[baseline]}
    table = {}
    base = rollouts_to_reach(x, list(mean[baseline]), target)
    for m in methods:
        finals = [r["final_full"][metric] for r in by[m]]
        reach = rollouts_to_reach(x, list(mean[m]), target)
        per_seed = [per_seed_reach(r) for r in by[m]]
        zero = [r["zero_adv_rollouts"] / r["rollouts"] for r in by[m]]
        seeds = [r["seed"] for r in by[m]]
        reached = [x for x in per_seed if x is not None]
        mine = dict(zip(seeds, per_seed, strict=True))
        both = [k for k in seeds if mine[k] is not None and base_reach.get(k)]
        table[m] = {
            "seeds": seeds,
            "final_mean": float(np.mean(finals)),
            "final_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0,
            "final_per_seed": finals,
            "auc_mean": float(np.mean(mean[m])),
            "rollouts_to_target": reach,
            "ratio_to_baseline": (reach / base) if reach is not None and base else None,
            "rollouts_to_target_per_seed": per_seed,
            "zero_adv_share_mean": float(np.mean(zero)),
            "zero_adv_share_per_seed": zero,
            # Intervals over seeds (95% Student t). Rollouts to target: over the seeds that
            # reached it (``reached`` of them); paired: this method − the baseline (or ÷ it),
            # seed by seed, over the seeds where both are defined.
            "final_ci": t_interval(finals),
            "rollouts_to_target_ci": {**t_interval(reached), "reached": len(reached)},
            "paired_final_diff": paired(
                dict(zip(seeds, finals, strict=True)),
                {r["seed"]: r["final_full"][metric] for r in by[baseline]},
            ),
            "paired_auc_diff": paired(
                {r["seed"]: float(np.mean([p[metric] for p in r["curve"]])) for r in by[m]},
                {r["seed"]: float(np.mean([p[metric] for p in r["curve"]])) for r in by[baseline]},
            ),
            "paired_rollouts_to_target_diff": paired(mine, base_reach),
            "paired_rollouts_to_target_ratio": {
                **t_interval([mine[k] / base_reach[k] for k in both]),
                "seeds": both,
            },
        }
    return {
        "metric": metric,
        "baseline": baseline,
        "start": start,
        "target": target,
        "methods": table,
    }


def plot(runs: list[dict], methods: list[str], path: Path, s: Settings, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    colors = dict(zip(methods, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for ax, metric in zip(axes[:2], ("sampled", "greedy"), strict=True):
        for m in methods:
            rs = [r for r in runs if r["method"] == m]
            x = np.array([p["rollouts"] for p in rs[0]["curve"]])
            y = np.array([[p[metric] for p in r["curve"]] for r in rs]) * 100
            ax.plot(x, y.mean(0), label=m, color=colors[m])
            ax.fill_between(x, y.min(0), y.max(0), alpha=0.15, color=colors[m])
        if metric == summary["metric"] and summary["target"] is not None:
            ax.axhline(summary["target"] * 100, ls=":", color="grey", lw=1)
        ax.set_xlabel("rollouts consumed")
        ax.set_ylabel(f"held-out accuracy, {metric} (%)")
        ax.set_title(f"{metric}: mean over {len(rs)} seeds, band = min..max")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    ax = axes[2]
    shares = [summary["methods"][m]["zero_adv_share_mean"] * 100 for m in methods]
    ax.bar(range(len(methods)), shares, color=[colors[m] for m in methods])
    ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("rollouts in all-equal-reward groups (%)")
    ax.set_title("compute that taught nothing")
    fig.suptitle(
        f"arith, tiny Qwen2 (h{s.hidden_size}, {s.layers} layers), {s.batch_size} prompts × "
        f"{s.n} rollouts/step, lr {s.lr}, {s.steps} steps; eval on {s.eval_subset} held-out prompts",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------------------------
# Driver


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--methods", default="grpo,alloc,mod,dynamo,dynamo-wl-std,dynamo-decay")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--quick", action="store_true", help="tiny smoke settings (minutes)")
    p.add_argument(
        "--out",
        default=None,
        help="output path stem (default benchmarks/results/sample_efficiency; with --quick, "
        "CACHE/quick/sample_efficiency so a smoke run never overwrites the committed figures)",
    )
    p.add_argument("--cache", default=os.environ.get("SE_CACHE", "/tmp/dynamo_se_cache"))
    p.add_argument("--metric", default="sampled", choices=("sampled", "greedy"))
    p.add_argument(
        "--baseline",
        default="grpo",
        help="the method every other is paired with and whose gain sets the target (default "
        "grpo; uniform: uniform n under prompt-mean, the control for allocation alone)",
    )
    p.add_argument(
        "--target-frac",
        type=float,
        default=0.8,
        help="target accuracy = start + frac × (GRPO's final mean − start)",
    )
    p.add_argument("--jobs", type=int, default=1, help="runs at the same time (one process each)")
    p.add_argument("--run-one", nargs=2, metavar=("METHOD", "SEED"), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    for f in Settings.__dataclass_fields__.values():
        if f.name == "extra":
            continue
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None)
    args = p.parse_args(argv)
    s = Settings()
    if args.quick:
        s = Settings(
            train_prompts=64, task_train=1564, warm_steps=300, steps=6, batch_size=8, eval_every=3
        )
        s.test_prompts = 1000
        s.eval_subset = 200
    for name in Settings.__dataclass_fields__:
        v = getattr(args, name, None)
        if v is not None and name != "extra":
            setattr(s, name, v)
    return args, s


def run_children(tasks: list[tuple[list[str], Path]], jobs: int) -> None:
    """Run each ``(command, result file)`` whose result file is missing as a child process, at
    most ``jobs`` at a time, in order (one thread each); the first failure stops the driver."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    pending = [(cmd, res) for cmd, res in tasks if not res.exists()]
    procs: list[tuple[subprocess.Popen, Path]] = []
    try:
        while pending or procs:
            while pending and len(procs) < jobs:
                cmd, res = pending.pop(0)
                procs.append((subprocess.Popen(cmd, env=env), res))
            for pr, res in list(procs):
                if pr.poll() is not None:
                    procs.remove((pr, res))
                    if pr.returncode != 0:
                        raise SystemExit(f"run {res.name} failed with exit code {pr.returncode}")
            time.sleep(0.5)
    finally:
        for pr, _ in procs:
            pr.kill()
            pr.wait()


def main(argv: list[str] | None = None) -> int:
    args, s = parse(argv)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    if args.run_one:
        import torch

        torch.set_num_threads(1)
        method, seed = args.run_one[0], int(args.run_one[1])
        run_one(method, seed, s, warm_start(s, cache), Path(args.result))
        return 0
    methods = args.methods.split(",")
    known = method_specs(s.decay)
    unknown = set(methods) - set(known)
    if unknown:
        raise SystemExit(f"--methods: unknown {sorted(unknown)}; known: {', '.join(known)}")
    if args.baseline not in methods:
        raise SystemExit(f"--baseline {args.baseline!r} must be one of --methods ({args.methods})")
    seeds = [int(x) for x in args.seeds.split(",")]
    t0 = time.time()
    warm = warm_start(s, cache)
    print(f"warm start ready: {warm} ({time.time() - t0:.0f}s)", flush=True)
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
    tasks = []
    for seed in seeds:  # seed-major, so a partial benchmark has every method on its first seeds
        for m in methods:
            res = cache / f"run-{s.key()}-{m}-{seed}.json"
            cmd = [sys.executable, __file__, *forwarded, "--run-one", m, str(seed)]
            tasks.append(([*cmd, "--result", str(res)], res))
    run_children(tasks, args.jobs)
    runs = [
        json.loads((cache / f"run-{s.key()}-{m}-{seed}.json").read_text())
        for seed in seeds
        for m in methods
    ]
    summary = {
        metric: summarise(runs, methods, metric, args.target_frac, args.baseline)
        for metric in ("sampled", "greedy")
    }
    default_out = (
        cache / "quick" / "sample_efficiency" if args.quick else RESULTS / "sample_efficiency"
    )
    out = Path(args.out) if args.out else default_out
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "what": "held-out accuracy against rollouts consumed, in-process (see module docstring)",
        "settings": asdict(s),
        "methods": {
            m: {
                **asdict(known[m]),
                "agg": method_agg(known[m], s),
                "n_range": method_bounds(known[m], s) if known[m].allocate else None,
            }
            for m in methods
        },
        "baseline": args.baseline,
        "seeds": seeds,
        "target_frac": args.target_frac,
        "summary": summary,
        "runs": runs,
        "wall_s": time.time() - t0,
    }
    write_result(out.with_suffix(".json"), report, separators=(",", ":"))
    plot(runs, methods, out.with_suffix(".png"), s, summary[args.metric])
    print_table(summary[args.metric], s)
    if args.metric != "greedy":
        print_table(summary["greedy"], s)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


def print_table(summary: dict, s: Settings) -> None:
    def ci(c: dict, scale: float = 100.0, fmt: str = ".1f") -> str:
        if c["mean"] is None:
            return "—"
        lo, hi = c["ci"]
        return f"{c['mean'] * scale:{fmt}} [{lo * scale:{fmt}}, {hi * scale:{fmt}}]"

    base = summary["baseline"]
    print(
        f"\nmetric: {summary['metric']} held-out accuracy ({s.test_prompts} prompts); start "
        f"{summary['start'] * 100:.1f}%, target "
        + (
            f"{summary['target'] * 100:.1f}%"
            if summary["target"] is not None
            else f"none ({base} did not gain)"
        )
        + "; [95% t interval over seeds]"
    )
    print(
        f"| method | final acc % (mean ± sd) | paired Δ final vs {base} (pp) | paired Δ mean-curve "
        f"(pp) | rollouts to target (seeds reached) | paired Δ rollouts | paired rollouts ratio "
        f"to {base} (seeds) | ratio of seed-mean curves | zero-adv share |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for m, r in summary["methods"].items():
        ratio = "—" if r["ratio_to_baseline"] is None else f"{r['ratio_to_baseline']:.2f}"
        reach = r["rollouts_to_target_ci"]
        pr = r["paired_rollouts_to_target_ratio"]
        print(
            f"| {m} | {r['final_mean'] * 100:.1f} ± {r['final_std'] * 100:.1f} | "
            f"{ci(r['paired_final_diff'])} | {ci(r['paired_auc_diff'])} | "
            f"{ci(reach, 1.0, '.0f')} ({reach['reached']}/{len(r['seeds'])}) | "
            f"{ci(r['paired_rollouts_to_target_diff'], 1.0, '.0f')} | "
            f"{ci(pr, 1.0, '.2f')} ({len(pr['seeds'])}) | {ratio} | "
            f"{r['zero_adv_share_mean'] * 100:.1f}% |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
