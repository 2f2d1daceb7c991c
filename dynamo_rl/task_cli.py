"""``dynamo-rl task NAME --out DIR``: write a built-in task's train/test parquet files."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dynamo-rl task",
        description="Write a built-in task (verl parquet layout): train.parquet and test.parquet.",
    )
    parser.add_argument("name", choices=["arith"], help="the task")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--train", type=int, default=4000, help="train prompts (default 4000)")
    parser.add_argument("--test", type=int, default=1000, help="held-out prompts (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    if args.train < 1 or args.test < 1:
        parser.error("--train and --test must be >= 1")
    from dynamo_rl.tasks.arith import write_task

    try:
        paths = write_task(args.out, args.train, args.test, args.seed)
    except ValueError as e:
        print(f"dynamo-rl task: {e}", file=sys.stderr)
        return 2
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0
