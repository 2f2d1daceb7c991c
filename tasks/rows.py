"""What every ``dynamo-rl data`` command shares: its error and the writer of its rows.

Both the converters of published files (:mod:`tasks.convert`) and the generated sources
(:mod:`tasks.reasoning_gym_data`) import it, so neither imports the other at load time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class ConvertError(ValueError):
    """A file or row a converter cannot read; the message names the file, row and field."""


def write_rows(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """``.parquet`` (verl's files) or JSON lines (anything else)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix.lower() in (".parquet", ".pq"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(list(rows)), p)
    else:
        with p.open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return p
