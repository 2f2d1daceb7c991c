"""``dynamo-rl eval``: held-out accuracy of a model, sampled on engines, scored by the reward service.

Two ways to run it:

- ``dynamo-rl eval --model DIR --data FILE``: self-contained; it starts an embedded engine on the
  model and a reward service on free ports, evaluates, and stops them.
- ``dynamo-rl eval --config run.yaml --data FILE``: against the running engines
  (``endpoints.engine_urls``) and reward service (``endpoints.reward_url``) — what ``dynamo-rl up``
  does before and after RL.

For each of the first ``--limit`` prompts it samples ``--n`` responses and reports
``avg@n`` (the mean fraction of correct samples per prompt: pass@1 estimated from n samples;
``accuracy`` in the output), ``pass@n`` (any sample correct) and the same by ``data_source``.
With ``--temperature 0`` and ``--n 1`` it is greedy pass@1. Each prompt is sampled with a seed of
its own derived from ``run.seed`` and its id (reproducible, independent across prompts);
``--samples FILE`` writes every sample with its verdict as JSONL.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynamo_rl.cli import parse_config, service_parser
from dynamo_rl.config import ExperimentConfig


def build_parser() -> argparse.ArgumentParser:
    parser = service_parser("eval", __doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--data", required=True, metavar="FILE",
                        help="held-out prompts (JSONL or verl parquet)")  # fmt: skip
    parser.add_argument("--model", metavar="DIR",
                        help="evaluate this model on engine and reward processes of its own")  # fmt: skip
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--limit", type=int, default=0,
                        help="evaluate the first N prompts only (0: all)")  # fmt: skip
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature (default: rollout.sampling.temperature)")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=16,
                        help="prompts in flight at once (default 16)")  # fmt: skip
    parser.add_argument("--out", metavar="FILE", help="also write the result as JSON here")
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
) -> dict[str, Any]:
    import asyncio

    from services.rollout.datasets import PromptRenderer, check_prompt_lengths, load_records
    from services.rollout.engines import EnginePool, EngineRequestError
    from services.rollout.loop import (
        load_tokenizer,
        make_engine_factory,
        prompt_limit,
        request_seed,
        sample_prompt,
        sampling_of,
        verify_groups,
    )
    from services.rollout.reward_client import RewardClient

    rc = cfg.rollout
    records = load_records(data, rc.dataset_format, rc.default_kind)
    if limit:
        records = records[:limit]
    renderer = PromptRenderer(load_tokenizer(tokenizer_dir), rc.prompt_template)
    # The worker's length policy, before any sampling (DatasetError, a ValueError, under error).
    lengths = check_prompt_lengths(
        records, renderer, prompt_limit(cfg, tokenizer_dir), rc.prompt_len_policy
    )
    print(f"dynamo-rl eval: {data}: {lengths.line()}", file=sys.stderr)
    records = lengths.records
    factory = make_engine_factory(cfg)
    pool = EnginePool([factory(u) for u in cfg.endpoints.engine_urls], max_wait_s=60.0)
    reward = RewardClient(cfg.endpoints.reward_url, timeout_s=rc.reward_timeout_s, max_wait_s=60.0)
    sampling = sampling_of(rc.sampling, temperature=temperature, seed=cfg.run.seed)
    gate = asyncio.Semaphore(concurrency)

    async def one(record) -> tuple[list[float], list[str]] | str:
        async with gate:
            _text, ids = lengths.rendered[record.prompt_id]

            # A seed of its own per prompt: with one seed for all, every prompt would share the
            # same n noise streams, and one unlucky draw would fail the same sample everywhere.
            # (The first request's seed leaves the chunk out: the same draws as one request.)
            def seed_of(chunk: int) -> int | None:
                extra = (chunk,) if chunk else ()
                return request_seed(cfg.run.seed, "eval", record.prompt_id, *extra)

            try:
                samples = await sample_prompt(
                    pool, ids, n, sampling, max_per_request=rc.max_n_per_request, seed_of=seed_of
                )
            except EngineRequestError as e:  # bad input, as in the worker: left out, counted
                return str(e)
            [results] = await verify_groups(
                reward, [record], [samples], lambda _p, j: f"{record.prompt_id}/{j}"
            )
            return [1.0 if r.correct else 0.0 for r in results], [x.text for x in samples]

    try:
        answers = await asyncio.gather(*(one(r) for r in records))
        versions = await pool.weight_versions()
    finally:
        await pool.aclose()
        await reward.aclose()
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
    scores = [sc for sc, _ in answers]
    if samples_path:
        with open(samples_path, "w") as f:
            for record, (sc, texts) in zip(records, answers, strict=True):
                for j, (score, text) in enumerate(zip(sc, texts, strict=True)):
                    row = {"prompt_id": record.prompt_id, "index": j, "text": text,
                           "correct": bool(score)}  # fmt: skip
                    f.write(json.dumps(row) + "\n")
    by_source: dict[str, list[list[float]]] = {}
    for record, sc in zip(records, scores, strict=True):
        by_source.setdefault(record.data_source, []).append(sc)

    def summary(groups: list[list[float]]) -> dict[str, float]:
        return {
            "accuracy": sum(sum(g) / len(g) for g in groups) / len(groups),
            f"pass@{n}": sum(1.0 for g in groups if max(g) > 0) / len(groups),
            "prompts": len(groups),
        }

    return {
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
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, cfg = parse_config(parser, argv)
    if args.n < 1 or args.limit < 0 or args.concurrency < 1:
        parser.error("--n and --concurrency must be >= 1 and --limit >= 0")
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
            from dynamo_rl.services import SERVICES

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
            evaluate(cfg, args.data, n=args.n, limit=args.limit, temperature=temperature,
                     concurrency=args.concurrency, tokenizer_dir=tokenizer_dir,
                     samples_path=args.samples)
        )  # fmt: skip
    except (RuntimeError, TimeoutError, ValueError, OSError, EngineError) as e:
        print(f"dynamo-rl eval: {e}", file=sys.stderr)
        return 1
    finally:
        for p in procs:
            p.stop()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0
