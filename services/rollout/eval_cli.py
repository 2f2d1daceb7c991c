"""``dynamo-rl eval``: held-out accuracy of a model, sampled on engines, scored by the reward service.

Two ways to run it:

- ``dynamo-rl eval --model DIR --data FILE [FILE ...]``: self-contained; it starts an embedded
  engine on the model and a reward service on free ports, evaluates, and stops them.
- ``dynamo-rl eval --config run.yaml --data FILE [FILE ...]``: against the running engines
  (``endpoints.engine_urls``) and reward service (``endpoints.reward_url``) — what ``dynamo-rl up``
  does before and after RL.

Each ``--data`` file is one benchmark (named by its file name, or ``NAME=FILE``). For each of its
first ``--limit`` prompts it samples ``--n`` responses and prints one table, a row per benchmark:
``avg@n`` (pass@1 averaged over the n samples; ``accuracy`` in the JSON), the unbiased ``pass@k``
for each ``--k`` (the Codex estimator 1 − C(n−c, k)/C(n, k)), ``maj@n`` (majority vote over the
samples' extracted answers), each with a seeded bootstrap 95% interval over prompts
(:mod:`services.rollout.eval_metrics`). ``--out FILE`` writes the figures as JSON with the sampling
settings and the prompt template they were measured under. With ``--temperature 0`` and ``--n 1``
it is greedy pass@1. Each prompt is sampled with a seed of its own derived from ``run.seed`` and
its id (reproducible, independent across prompts); ``--samples FILE`` writes every sample with its
verdict as JSONL.

With ``rollout.env.name: verifiers`` each ``--data`` names one of the environment's own datasets,
``eval`` (its ``eval_dataset``) or ``train`` (its training rows, only when named), played by the
worker's verifiers player and scored by the environment's rubric, no reward service involved
(:mod:`services.rollout.verifiers_eval`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynamo_rl.cli import parse_config, service_parser
from dynamo_rl.config import ExperimentConfig
from dynamo_rl.contracts.reward import ItemResult
from services.rollout.eval_metrics import episode_summary


def build_parser() -> argparse.ArgumentParser:
    parser = service_parser("eval", __doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--data", required=True, nargs="+", metavar="FILE",
                        help="benchmarks: held-out prompts (JSONL or verl parquet), one file each, "
                        "optionally named NAME=FILE; with rollout.env.name verifiers: eval or train, "
                        "the environment's own datasets")  # fmt: skip
    parser.add_argument("--model", metavar="DIR",
                        help="evaluate this model on engine and reward processes of its own")  # fmt: skip
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--k", metavar="K,K", help="pass@k reported for these k (each 1..n; "
                        "default 1 and n)")  # fmt: skip
    parser.add_argument("--bootstrap", type=int, default=1000, metavar="B",
                        help="bootstrap resamples of the 95%% intervals, seeded with run.seed "
                        "(default 1000; 0: none)")  # fmt: skip
    parser.add_argument("--limit", type=int, default=0,
                        help="evaluate the first N prompts only (0: all)")  # fmt: skip
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature (default: rollout.sampling.temperature)")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=16,
                        help="prompts in flight at once (default 16)")  # fmt: skip
    parser.add_argument("--out", metavar="FILE",
                        help="write the result as JSON here (figures, intervals, sampling "
                        "settings, prompt template)")  # fmt: skip
    parser.add_argument("--samples", metavar="FILE",
                        help="write every sample (prompt_id, index, text, correct) as JSONL here")  # fmt: skip
    return parser


async def evaluate(
    cfg: ExperimentConfig,
    data: str,
    *,
    n: int,
    limit: int,
    temperature: float,
    concurrency: int,
    tokenizer_dir: str,
    samples_path: str | None = None,
    ks: list[int] | None = None,
    bootstrap: int = 1000,
    benchmark: str | None = None,
) -> dict[str, Any]:
    """One benchmark file: its figures (``metrics``: avg@n, pass@k, maj@n with intervals), the
    accuracy and pass@n also by ``data_source`` and by tier (``by_tier``: rows with a ``tier`` or
    ``extra_info.tier``), and the first prompt as rendered."""
    import asyncio

    from dynamo_rl.envs import EnvContext, check_env_config, make_env
    from services.rollout.build import (
        make_engine_factory,
        make_sandbox,
        prepare_prompts,
        sampling_of,
    )
    from services.rollout.datasets import load_records
    from services.rollout.engines import EnginePool, EngineRequestError
    from services.rollout.episodes import Conversation
    from services.rollout.eval_metrics import PromptOutcome, summarize
    from services.rollout.pipeline import Seeds, generate_group, verify_groups
    from services.rollout.reward_client import RewardClient

    rc = cfg.rollout
    check_env_config(rc.env, verifiers=True)
    if rc.env.name == "verifiers":  # the environment's own dataset, played by its protocol
        from services.rollout.verifiers_eval import evaluate_verifiers

        return await evaluate_verifiers(
            cfg, data, n=n, limit=limit, temperature=temperature, concurrency=concurrency,
            tokenizer_dir=tokenizer_dir, samples_path=samples_path, ks=ks, bootstrap=bootstrap,
            benchmark=benchmark,
        )  # fmt: skip
    records = load_records(data, rc.dataset_format, rc.default_kind)
    if limit:
        records = records[:limit]
    # The worker's length policy, before any sampling (DatasetError, a ValueError, under error).
    renderer, lengths, limits = prepare_prompts(cfg, records, tokenizer_dir)
    print(f"dynamo-rl eval: {data}: {lengths.line()}", file=sys.stderr)
    records = lengths.records
    factory = make_engine_factory(cfg)
    pool = EnginePool([factory(u) for u in cfg.endpoints.engine_urls], max_wait_s=60.0)
    reward = RewardClient(cfg.endpoints.reward_url, timeout_s=rc.reward_timeout_s, max_wait_s=60.0)
    sampling = sampling_of(rc.sampling, temperature=temperature, seed=cfg.run.seed)
    gate = asyncio.Semaphore(concurrency)
    sandbox = make_sandbox(cfg)
    conversation = Conversation(renderer.tokenizer, renderer.template)
    episode_stats: list[dict[str, Any]] = []

    async def one(record) -> tuple[list[ItemResult], list[str]] | str:
        """n episodes of the prompt in ``rollout.env``, through the worker's pipeline; each
        episode's final turn is scored (one dropped for a sandbox outage counts as wrong). A seed
        of its own per prompt: with one seed for all, every prompt would share the same n noise
        streams, and one unlucky draw would fail the same sample everywhere."""
        async with gate:
            try:
                episodes = await generate_group(
                    pool, record, lengths.rendered[record.prompt_id], n,
                    new_env=lambda seed: make_env(EnvContext(limits, sandbox, seed=seed)),
                    conversation=conversation, sampling=sampling, limits=limits,
                    max_per_request=rc.max_n_per_request,
                    seeds=Seeds(cfg.run.seed, ("eval", record.prompt_id)),
                )  # fmt: skip
            except EngineRequestError as e:  # bad input, as in the worker: left out, counted
                return str(e)
            [results] = await verify_groups(
                reward, [record], [episodes], lambda _p, j: f"{record.prompt_id}/{j}"
            )
            results = [
                r.model_copy(update={"score": 0.0, "correct": False, "detail": "episode dropped"})
                if e.dropped is not None
                else r
                for e, r in zip(episodes, results, strict=True)
            ]
            for e in episodes:
                if e.multi_turn:
                    calls = e.tool_calls
                    episode_stats.append({
                        "turns": len(e.turns),
                        "tool_calls": len(calls),
                        "tool_errors": sum(1 for c in calls if c.error),
                        "dropped": e.dropped is not None,
                        "tier": record.tier,
                    })  # fmt: skip
            return results, [e.transcript for e in episodes]

    t0 = time.monotonic()
    try:
        answers = await asyncio.gather(*(one(r) for r in records))
        elapsed = time.monotonic() - t0
        versions = await pool.weight_versions()
    finally:
        await pool.aclose()
        await reward.aclose()
        if sandbox is not None:
            await sandbox.aclose()
    refused = [
        (r.prompt_id, a) for r, a in zip(records, answers, strict=True) if isinstance(a, str)
    ]
    if refused:
        print(f"dynamo-rl eval: {len(refused)} of {len(records)} prompts refused by the engine, "
              f"left out (first: {refused[0][0]}: {refused[0][1]})", file=sys.stderr)  # fmt: skip
        if len(refused) == len(records):
            raise RuntimeError(f"every prompt was refused by the engine ({refused[0][1]})")
        kept = [(r, a) for r, a in zip(records, answers, strict=True) if not isinstance(a, str)]
        records, answers = [r for r, _ in kept], [a for _, a in kept]
    scores = [[1.0 if r.correct else 0.0 for r in res] for res, _ in answers]
    if samples_path:
        # Appended: evaluate_all empties the file and gives every benchmark's samples in turn.
        with open(samples_path, "a" if benchmark else "w") as f:
            for record, sc, (_, texts) in zip(records, scores, answers, strict=True):
                for j, (score, text) in enumerate(zip(sc, texts, strict=True)):
                    row = {"prompt_id": record.prompt_id, "index": j, "text": text,
                           "correct": bool(score)}  # fmt: skip
                    if benchmark:
                        row["benchmark"] = benchmark
                    f.write(json.dumps(row) + "\n")
    by_source: dict[str, list[list[float]]] = {}
    by_tier: dict[str, list[list[float]]] = {}
    for record, sc in zip(records, scores, strict=True):
        by_source.setdefault(record.data_source, []).append(sc)
        if record.tier is not None:
            by_tier.setdefault(record.tier, []).append(sc)

    def summary(groups: list[list[float]]) -> dict[str, float]:
        return {
            "accuracy": sum(sum(g) / len(g) for g in groups) / len(groups),
            f"pass@{n}": sum(1.0 for g in groups if max(g) > 0) / len(groups),
            "prompts": len(groups),
        }

    outcomes = [PromptOutcome([r.correct for r in res], [r.answer for r in res])
                for res, _ in answers]  # fmt: skip
    extra: dict[str, Any] = {}
    if episode_stats:  # multi-turn episodes were played
        played = episode_summary(episode_stats, rc.env.name)
        # Throughput: every episode played (generated, its tools run, verified) per second.
        extra["episodes"] = {**played, "wall_s": round(elapsed, 3),
                             "episodes_per_second": len(episode_stats) / max(elapsed, 1e-9)}  # fmt: skip
    return {
        **extra,
        **summary(scores),
        "n": n,
        "temperature": temperature,
        "data": str(data),
        "weight_versions": versions,
        "prompts_over_length": {
            "limit": lengths.limit,
            "over": lengths.over,
            "policy": lengths.policy,
        },
        "prompts_refused": len(refused),
        "by_data_source": {k: summary(v) for k, v in sorted(by_source.items())},
        # Rows with a difficulty tier (the arith task's extra_info.tier); {} when none has one.
        # Multi-turn episodes add each tier's episode figures (tool-call rate, ...).
        "by_tier": {
            k: {**summary(v), **tier_episodes(episode_stats, k, rc.env.name)}
            for k, v in sorted(by_tier.items())
        },
        "metrics": summarize(outcomes, ks, resamples=bootstrap, seed=cfg.run.seed)["metrics"],
        "example_prompt": lengths.rendered[records[0].prompt_id][0],  # as sent
    }


def tier_episodes(stats: list[dict[str, Any]], tier: str, env: str) -> dict[str, Any]:
    """``{"episodes": <episode_summary of the tier's episodes>}``, or {} when none was played
    (single-turn)."""
    mine = [s for s in stats if s.get("tier") == tier]
    return {"episodes": episode_summary(mine, env)} if mine else {}


def is_override(spec: str) -> bool:
    """Whether a ``--data`` entry is a config override (``run.seed=1``), not ``NAME=FILE``."""
    key, sep, _ = spec.partition("=")
    return bool(sep) and "." in key and key.split(".")[0] in ExperimentConfig.model_fields


def benchmark_files(specs: Sequence[str]) -> dict[str, str]:
    """``--data`` entries as benchmark name -> file: ``NAME=FILE``, else the file's name without
    its extension (``test.parquet`` in a folder ``gsm8k``: ``gsm8k/test``, to stay unique)."""
    named: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or "/" in name:
            path, name = spec, Path(spec).stem
            if name in named or name in ("test", "train", "validation"):
                name = f"{Path(spec).parent.name}/{name}"
        if name in named:
            raise ValueError(f"--data: two benchmarks named {name!r}; name them NAME=FILE")
        named[name] = path
    return named


async def evaluate_all(
    cfg: ExperimentConfig, benchmarks: dict[str, str], *, n: int, limit: int, temperature: float,
    concurrency: int, tokenizer_dir: str, samples_path: str | None, ks: list[int] | None,
    bootstrap: int,
) -> dict[str, Any]:  # fmt: skip
    """Every benchmark in turn, and what they were measured under. The top-level ``accuracy``,
    ``pass@n`` and ``prompts`` are over all benchmarks' prompts together (``up`` reads them)."""
    from dynamo_rl.prompts import uses_chat_template
    from services.rollout.build import load_tokenizer, sampling_of

    results: dict[str, dict[str, Any]] = {}
    if samples_path:
        Path(samples_path).write_text("")  # every benchmark's samples follow, each row named
    for name, path in benchmarks.items():
        results[name] = await evaluate(
            cfg, path, n=n, limit=limit, temperature=temperature, concurrency=concurrency,
            tokenizer_dir=tokenizer_dir, samples_path=samples_path, ks=ks, bootstrap=bootstrap,
            benchmark=name,
        )  # fmt: skip
    prompts = sum(r["prompts"] for r in results.values())
    rc = cfg.rollout
    tokenizer = load_tokenizer(tokenizer_dir)
    chat = uses_chat_template(tokenizer, rc.prompt_template)
    sampling = sampling_of(rc.sampling, temperature=temperature, seed=cfg.run.seed)
    last = list(results.values())[-1]
    return {
        "accuracy": sum(r["accuracy"] * r["prompts"] for r in results.values()) / prompts,
        f"pass@{n}": sum(r[f"pass@{n}"] * r["prompts"] for r in results.values()) / prompts,
        "prompts": prompts,
        "n": n,
        "temperature": temperature,
        "weight_versions": last["weight_versions"],
        "benchmarks": results,
        "sampling": {
            **dataclasses.asdict(sampling),
            "n": n,
            "max_n_per_request": rc.max_n_per_request,
            "seeds": "per prompt: run.seed, 'eval', prompt id, request chunk",
        },
        "prompt_template": {
            "setting": rc.prompt_template,
            "rendered_with": "tokenizer chat template"
            if chat
            else ("raw" if rc.prompt_template == "raw" else "plain (Role: content, Assistant:)"),
            "chat_template": getattr(tokenizer, "chat_template", None) if chat else None,
            "tokenizer": tokenizer_dir,
        },
        "bootstrap": {"resamples": bootstrap, "seed": cfg.run.seed, "confidence": 0.95},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, cfg = parse_config(parser, argv)
    moved = [d for d in args.data if is_override(d)]
    if moved:
        # `--data a b run.seed=1`: --data took the overrides too; parse them as overrides.
        rest = [a for a in (argv or []) if a not in moved]
        args, cfg = parse_config(parser, [*moved, *rest])
    if args.n < 1 or args.limit < 0 or args.concurrency < 1 or args.bootstrap < 0:
        parser.error("--n and --concurrency must be >= 1, --limit and --bootstrap >= 0")
    try:
        ks = sorted({int(k) for k in args.k.split(",") if k.strip()}) if args.k else None
    except ValueError:
        parser.error(f"--k: comma-separated integers, got {args.k!r}")
    if ks is not None and not all(1 <= k <= args.n for k in ks):
        parser.error(f"--k: each k must be in 1..{args.n} (--n, the samples per prompt)")
    try:
        benchmarks = benchmark_files(args.data)
    except ValueError as e:
        parser.error(str(e))
    if cfg.rollout.env.name == "verifiers":  # the environment's datasets, named as given
        from services.rollout.verifiers_eval import SPLITS

        if not set(args.data) <= set(SPLITS):
            parser.error(f"--data: with rollout.env.name 'verifiers' it names the environment's "
                         f"datasets, each one of {list(SPLITS)} (eval: its eval_dataset; train: "
                         f"its training rows), got {args.data}")  # fmt: skip
        benchmarks = {d: d for d in args.data}
    from dynamo_rl.envs import check_env_config

    try:
        check_env_config(cfg.rollout.env, verifiers=True)
    except ValueError as e:  # a config error, refused before any process starts
        print(f"dynamo-rl eval: {e}", file=sys.stderr)
        return 2
    import asyncio

    from dynamo_rl.procs import ServiceProcess
    from services.rollout.engines import EngineError

    procs: list[ServiceProcess] = []
    tokenizer_dir = cfg.rollout.tokenizer or args.model or cfg.engine.model
    if not tokenizer_dir:
        print(
            "dynamo-rl eval: give --model DIR, or rollout.tokenizer / engine.model", file=sys.stderr
        )
        return 2
    try:
        if args.model:
            # Self-contained: an engine and a reward service of our own on free ports.
            from dynamo_rl.service_table import SERVICES

            logs = Path(tempfile.mkdtemp(prefix="dynamo-eval-"))
            engine, engine_url = SERVICES["engine"].start(
                logs / "engine.log", "--model", args.model, "engine.register_in_redis=false",
                timeout=180, wait=False,
            )  # fmt: skip
            procs.append(engine)
            rewardp, reward_url = SERVICES["reward"].start(logs / "reward.log", timeout=180)
            procs.append(rewardp)
            SERVICES["engine"].wait_ready(engine, engine_url, 180)
            cfg.endpoints.engine_urls = [engine_url]
            cfg.endpoints.reward_url = reward_url
        temperature = (
            args.temperature if args.temperature is not None else cfg.rollout.sampling.temperature
        )
        result = asyncio.run(
            evaluate_all(cfg, benchmarks, n=args.n, limit=args.limit, temperature=temperature,
                         concurrency=args.concurrency, tokenizer_dir=tokenizer_dir,
                         samples_path=args.samples, ks=ks, bootstrap=args.bootstrap)
        )  # fmt: skip
    except (RuntimeError, TimeoutError, ValueError, OSError, EngineError) as e:
        print(f"dynamo-rl eval: {e}", file=sys.stderr)
        return 1
    finally:
        for p in procs:
            p.stop()
    from services.rollout.eval_metrics import format_table

    sampling = result["sampling"]
    print(format_table(result["benchmarks"]))
    print(f"(percent, [bootstrap 95% interval]; n={args.n} samples per prompt at temperature "
          f"{sampling['temperature']:g}, top_p {sampling['top_p']:g}, max_tokens "
          f"{sampling['max_tokens']}, seed {cfg.run.seed}; prompts rendered with "
          f"{result['prompt_template']['rendered_with']})")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0
