"""``dynamo-rl task NAME --out DIR``: write a built-in task's train/test parquet files.

``arith-prefs`` writes preference pairs of the same task (``train.jsonl``/``test.jsonl``, prompt +
chosen reference answer + rejected wrong answer) for the learner's dpo mode."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dynamo-rl task",
        description="Write a built-in task (verl parquet layout): train.parquet and test.parquet.",
    )
    parser.add_argument(
        "name", choices=["arith", "arith-prefs"], help="the task (arith-prefs: DPO pairs of arith)"
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--train", type=int, default=4000, help="train prompts (default 4000)")
    parser.add_argument("--test", type=int, default=1000, help="held-out prompts (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--tiers", metavar="A,B", help="arith-prefs: keep only these tiers")
    parser.add_argument("--pairs-per-prompt", type=int, default=1, metavar="K",
                        help="arith-prefs: wrong answers per prompt, 1..9 (default 1)")  # fmt: skip
    parser.add_argument("--wrong", choices=["random", "units"], default="random",
                        help="arith-prefs: wrong answers of the right length (random, default) "
                        "or with only the units digit wrong (units, harder)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.train < 1 or args.test < 1:
        parser.error("--train and --test must be >= 1")
    if not 1 <= args.pairs_per_prompt <= 9:
        parser.error("--pairs-per-prompt must be in 1..9")
    from tasks.arith import TIERS, write_preferences, write_task

    try:
        if args.name == "arith-prefs":
            tiers = [t for t in (args.tiers or "").split(",") if t] or None
            unknown = sorted(set(tiers or ()) - {t.name for t in TIERS})
            if unknown:
                parser.error(f"--tiers: unknown {', '.join(unknown)}")
            paths = write_preferences(
                args.out, args.train, args.test, args.seed, tiers, args.pairs_per_prompt, args.wrong
            )
        else:
            paths = write_task(args.out, args.train, args.test, args.seed)
    except ValueError as e:
        print(f"dynamo-rl task: {e}", file=sys.stderr)
        return 2
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0
