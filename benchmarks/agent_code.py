"""The code-interpreter recipe through ``dynamo-rl up``, and its episode throughput.

    .venv/bin/python benchmarks/agent_code.py                  # seed 0, the recipe's settings
    .venv/bin/python benchmarks/agent_code.py --quick          # smoke run (tiny settings)

One ``dynamo-rl up --config configs/agent_code.yaml run.seed=N`` (the ``when`` task's hard and
two-call tiers in ``code_interpreter`` episodes, each cell run by the reward service's sandbox
through ``POST /run_code``) into ``<runs>/code-seed<N>``; a run whose ``summary.json`` exists is
read, not run again. Printed and written to ``--out`` (default
``benchmarks/results/agent_code.json``; with ``--quick`` ``/tmp/agent_code_quick.json``): held-out
accuracy before and after RL, overall and per tier, the tool calls per episode and the share of
calls that failed, and the evaluations' throughput — episodes per second and tool calls per
second of ``dynamo-rl eval`` (every episode generated, its cells run, its answer verified; from
its ``episodes.wall_s``) — with the machine's load average while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from agent_recipe import failed_warm_start, out_path, result_of, run_up, write_doc  # noqa: E402 - one way to run and read an up run
from agent_when import tiers_of  # noqa: E402 - per-tier figures of an evaluation

CONFIG = REPO / "configs" / "agent_code.yaml"


def throughput(eval_result: dict) -> dict:
    """Episodes/s and tool calls/s of one evaluation, with what they count."""
    [bench] = list(eval_result["benchmarks"].values())[:1]
    ep = bench["episodes"]
    wall = ep["wall_s"]
    return {
        "episodes": ep["episodes"],
        "wall_s": wall,
        "episodes_per_second": round(ep["episodes"] / wall, 3),
        "tool_calls_per_second": round(ep["episodes"] * ep["tool_calls_mean"] / wall, 3),
        "tool_calls_mean": round(ep["tool_calls_mean"], 3),
        "tool_error_rate": round(ep["tool_error_rate"], 4),
        "turns_mean": round(ep["turns_mean"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="run.seed (default 0)")
    p.add_argument("--runs", default="runs/agent-code", help="folder of the run folder")
    p.add_argument("--out", help="result JSON (see above for the default)")
    p.add_argument("--quick", action="store_true", help="tiny smoke settings")
    p.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = p.parse_args(argv)
    out = out_path(args.out, args.quick, "agent_code")
    run_dir = Path(args.runs).resolve() / f"code-seed{args.seed}"
    doc = {
        "command": f"dynamo-rl up --config configs/agent_code.yaml run.seed={args.seed}",
        "quick": args.quick,
        "overrides": args.overrides,
        "cpus": os.cpu_count(),
    }
    run_up(run_dir, "code", args.seed, args.quick, CONFIG, args.overrides)
    failed = failed_warm_start(run_dir)
    if failed is not None:
        print(f"code seed {args.seed}: the warm start failed its check: {failed['error']}; "
              f"checks {failed.get('checks')}", flush=True)  # fmt: skip
        write_doc(out, {**doc, "record": {"warm_start_failed": failed}})
        return 1
    record = result_of(run_dir)
    record.pop("curve", None)
    for which in ("before", "after"):
        result = json.loads((run_dir / f"eval_{which}.json").read_text())
        record[f"tiers_{which}"] = tiers_of(result)
        record[f"throughput_{which}"] = t = throughput(result)
        print(f"{which} RL: accuracy {100 * result['accuracy']:.1f}%, "
              f"{t['episodes_per_second']:.2f} episodes/s, {t['tool_calls_per_second']:.2f} "
              f"tool calls/s ({t['episodes']} episodes in {t['wall_s']:.1f} s), "
              f"{t['tool_calls_mean']:.2f} calls per episode, "
              f"{100 * t['tool_error_rate']:.1f}% of calls failed", flush=True)  # fmt: skip
    doc = {
        **doc,
        "note": "episodes/s: dynamo-rl eval's episodes over its wall time (generation, cells in "
        "the reward service's sandbox, verification), on a machine shared with other jobs "
        "(load_average_1m)",
        "record": record,
    }
    write_doc(out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
