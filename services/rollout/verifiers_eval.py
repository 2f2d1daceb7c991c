"""``dynamo-rl eval`` of a verifiers environment (``rollout.env.name: verifiers``; ``docs/agents.md``).

The benchmark is one of the environment's own datasets, named by ``--data``
(:data:`SPLITS`): ``eval``, its ``eval_dataset`` (refused when the environment has none: nothing
falls back silently), or ``train``, its training ``dataset`` -- only when asked for by that name,
since those rows are not held out. The first ``--limit`` rows (less any the worker's length
policy drops) are played ``--n`` times by the worker's own
:class:`~services.rollout.verifiers_worker.VerifiersPlayer` on the engines, each episode seeded
from ``run.seed``, ``"eval"`` and the prompt id; the rubric's reward scores it, and a sample is
correct when its reward is above 0 (the allocator's success in the worker). A dropped episode
(its protocol or rubric failed, or the engine gave no token ids) counts as wrong. The result has
the keys of :func:`services.rollout.eval_cli.evaluate`'s (avg@n, pass@k, maj@n over the last model
turn's text, with intervals), with ``reward_mean`` (the rubric's mean reward, dropped episodes
0) and ``episodes`` (turns per episode, dropped).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from dynamo_rl.config import ExperimentConfig

__all__ = ["SPLITS", "evaluate_verifiers", "split_rows"]

SPLITS = ("eval", "train")
"""What ``--data`` may name with a verifiers environment: its ``eval_dataset``, its ``dataset``."""


def split_rows(env: Any, split: str, module: str) -> list[dict[str, Any]]:
    """The rows of the environment's ``split`` (:data:`SPLITS`); ValueError naming ``--data``
    and the allowed values."""
    from services.rollout.verifiers_env import verifiers_rows

    if split == "train":
        return verifiers_rows(env)
    if split != "eval":
        raise ValueError(
            f"--data: with rollout.env.name 'verifiers' it names the environment's dataset, one "
            f"of {list(SPLITS)} (eval: its eval_dataset; train: its training rows), got {split!r}"
        )
    env.build_eval_dataset()
    if env.eval_dataset is None:
        raise ValueError(
            f"--data eval: the environment rollout.env.verifiers.module {module!r} has no "
            "eval_dataset; give --data train to evaluate on its training rows (not held out)"
        )
    return [dict(row) for row in env.get_eval_dataset()]


async def evaluate_verifiers(
    cfg: ExperimentConfig, split: str, *, n: int, limit: int, temperature: float, concurrency: int,
    tokenizer_dir: str, samples_path: str | None = None, ks: list[int] | None = None,
    bootstrap: int = 1000, benchmark: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One split of the environment, evaluated (see the module docstring)."""
    import sys

    from prometheus_client import CollectorRegistry

    from services.rollout.build import make_engine_factory, prepare_prompts, sampling_of
    from services.rollout.engines import EnginePool
    from services.rollout.eval_metrics import PromptOutcome, episode_summary, summarize
    from services.rollout.metrics import WorkerMetrics
    from services.rollout.pipeline import Seeds
    from services.rollout.verifiers_worker import VerifiersPlayer, load_env_of, verifiers_records

    rc = cfg.rollout
    if cfg.learner.lora.enabled:
        raise ValueError(
            "learner.lora.enabled must be false with rollout.env.name 'verifiers': the "
            "environment's chat requests do not name the learner's adapter"
        )
    env, label = load_env_of(cfg)
    assert rc.env.verifiers is not None  # load_env_of refuses it unset
    rows = split_rows(env, split, rc.env.verifiers.module)
    records = verifiers_records(rows, label)
    if limit:
        records = records[:limit]
    _renderer, lengths, _limits = prepare_prompts(cfg, records, tokenizer_dir)
    print(f"dynamo-rl eval: {label} {split}: {lengths.line()}", file=sys.stderr)
    records = lengths.records
    if not records:
        raise ValueError(f"--data {split}: no prompt of the environment's {split} rows is kept")
    factory = make_engine_factory(cfg)
    pool = EnginePool([factory(u) for u in cfg.endpoints.engine_urls], max_wait_s=60.0)
    sampling = sampling_of(rc.sampling, temperature=temperature, seed=cfg.run.seed)
    metrics = WorkerMetrics(CollectorRegistry())
    by_id = {r.prompt_id: row for r, row in zip(verifiers_records(rows, label), rows, strict=True)}
    player = VerifiersPlayer(env, by_id, sampling, metrics, model=rc.model_name)
    gate = asyncio.Semaphore(concurrency)

    async def one(record) -> tuple[list[float], list[bool], list[str], list[int]]:
        """n episodes of the prompt; the dropped ones as reward 0, wrong, no text."""
        async with gate:
            seeds = Seeds(cfg.run.seed, ("eval", record.prompt_id))
            episodes, verdicts = await player.play_group(pool, record, n, seeds)
        dropped = n - len(episodes)
        rewards = [v.score for v in verdicts] + [0.0] * dropped
        correct = [v.correct for v in verdicts] + [False] * dropped
        texts = [e.model_texts[-1] if e.model_texts else "" for e in episodes] + [""] * dropped
        turns = [len(e.turns) for e in episodes] + [0] * dropped
        return rewards, correct, texts, turns

    t0 = time.monotonic()
    try:
        played = await asyncio.gather(*(one(r) for r in records))
        elapsed = time.monotonic() - t0
        versions = await pool.weight_versions()
    finally:
        await pool.aclose()
    if samples_path:
        with open(samples_path, "a" if benchmark else "w") as f:
            for record, (rewards, correct, texts, _) in zip(records, played, strict=True):
                for j in range(n):
                    row = {"prompt_id": record.prompt_id, "index": j, "text": texts[j],
                           "correct": correct[j], "reward": rewards[j]}  # fmt: skip
                    if benchmark:
                        row["benchmark"] = benchmark
                    f.write(json.dumps(row) + "\n")
    scores = [[1.0 if c else 0.0 for c in p[1]] for p in played]
    summary = {
        "accuracy": sum(sum(g) / n for g in scores) / len(scores),
        f"pass@{n}": sum(1.0 for g in scores if max(g) > 0) / len(scores),
        "prompts": len(scores),
    }
    stats = [
        {"turns": t, "tool_calls": 0, "tool_errors": 0, "dropped": t == 0, "tier": None}
        for p in played for t in p[3]
    ]  # fmt: skip
    outcomes = [PromptOutcome(p[1], [t.strip() or None for t in p[2]]) for p in played]
    return {
        "episodes": {
            **episode_summary(stats, "verifiers"),
            "wall_s": round(elapsed, 3),
            "episodes_per_second": len(stats) / max(elapsed, 1e-9),
        },
        **summary,
        "reward_mean": sum(sum(p[0]) for p in played) / (n * len(played)),
        "n": n,
        "temperature": temperature,
        "data": f"rollout.env.verifiers {rc.env.verifiers.module} ({split})",
        "weight_versions": versions,
        "prompts_over_length": {
            "limit": lengths.limit,
            "over": lengths.over,
            "policy": lengths.policy,
        },
        "prompts_refused": 0,
        "by_data_source": {label: summary},
        "by_tier": {},
        "metrics": summarize(outcomes, ks, resamples=bootstrap, seed=cfg.run.seed)["metrics"],
        "example_prompt": lengths.rendered[records[0].prompt_id][0],
    }
