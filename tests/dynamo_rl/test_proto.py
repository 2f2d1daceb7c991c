"""The committed protobuf/gRPC stubs are exactly what scripts/gen_proto.py produces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_generator(tmp_path: Path) -> None:
    out = tmp_path / "proto"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    committed = ROOT / "dynamo_rl" / "proto"
    generated = {p.relative_to(out): p.read_text() for p in out.rglob("*.py*")}
    existing = {
        p.relative_to(committed): p.read_text()
        for p in committed.rglob("*.py*")
        if "__pycache__" not in p.parts
    }
    assert set(generated) == set(existing), "run: python scripts/gen_proto.py"
    stale = [str(k) for k in generated if generated[k] != existing[k]]
    assert not stale, f"stale stubs {stale}; run: python scripts/gen_proto.py"
