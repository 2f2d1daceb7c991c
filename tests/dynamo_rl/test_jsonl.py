"""Reading back a JSON-lines file while its writer appends (metric histories, sample logs)."""

from __future__ import annotations

from pathlib import Path

from dynamo_rl.jsonl import read_records


def test_records_with_the_key_in_order_skipping_what_is_not_one(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    assert read_records(path, "samples") == []  # not written yet
    path.write_text(
        '{"samples": 1}\n'
        "not json\n"
        '["samples"]\n'  # an array, not an object
        '{"other": 2}\n'  # an object without the key
        '{"samples": 3}\n'
        '{"samples": 4, "t"'  # the line the writer is still writing
    )
    assert read_records(path, "samples") == [{"samples": 1}, {"samples": 3}]
