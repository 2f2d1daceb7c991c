"""Reading the services' JSON-lines files: whatever a crash or another writer left is skipped."""

from __future__ import annotations

from pathlib import Path

from dynamo_rl.jsonl import read_records


def test_only_whole_objects_with_the_key_are_read(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    assert read_records(path, "samples") == []  # not written yet
    path.write_text(
        '{"samples": [], "t": 1}\n'
        "[1, 2]\n"  # not an object
        '{"other": 1}\n'  # no key
        "\n"
        '{"samples": [["a", {}, 1.0]], "t": 2}\n'
        '{"samples": [["a", {}, 2'  # half-written by a crash
    )
    assert [r["t"] for r in read_records(path, "samples")] == [1, 2]
