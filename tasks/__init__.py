"""Task data in the verl parquet layout the rollout worker and the learner read.

- :mod:`tasks.arith` and :mod:`tasks.products`: the built-in tasks, small verifiable datasets
  generated locally (no download); this module holds the row layout and writer they share;
- :mod:`tasks.cli`: ``dynamo-rl task``, a built-in task's train/test files;
- :mod:`tasks.convert`: ``dynamo-rl data``, published datasets converted into the same layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def reference_answer(value: int) -> str:
    """The boxed answer the warm start imitates and the math scorer reads."""
    return f"\\boxed{{{value}}}"


def task_row(data_source: str, question: str, value: int, tier: str, split: str,
             index: int) -> dict:  # fmt: skip
    """One question in the verl parquet layout (what ``dynamo-rl data`` writes for real
    datasets): the prompt as a chat message, the integer ground truth, the tier and the reference
    answer in ``extra_info``."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(value)},
        "extra_info": {
            "index": index,
            "split": split,
            "tier": tier,
            "answer": reference_answer(value),
        },
    }


def write_splits(
    out_dir: str | Path, train: Sequence[dict], test: Sequence[dict]
) -> dict[str, Path]:
    """``train.parquet`` and ``test.parquet`` in ``out_dir`` (created); returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows in (("train", train), ("test", test)):
        path = out / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(list(rows)), path)
        paths[name] = path
    return paths
