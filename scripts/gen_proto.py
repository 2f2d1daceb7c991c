"""Generate the Python protobuf and gRPC modules from proto/ into dynamo_rl/proto/.

The generated files are committed; tests/dynamo_rl/test_proto.py regenerates them into a temporary
folder and fails when they differ, so run this script after editing a .proto file:

    python scripts/gen_proto.py
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
DEFAULT_OUT = ROOT / "dynamo_rl" / "proto"
# protoc writes imports relative to the proto root ("from dynamo.v1 import x_pb2"); the modules
# live inside the dynamo_rl package, so the imports are made absolute.
_IMPORT = re.compile(r"^from dynamo\.v1 import", re.MULTILINE)


def generate(out: Path) -> list[Path]:
    from grpc_tools import _protoc_compiler, protoc  # noqa: F401 (protoc brings the well-known types)

    sources = sorted(PROTO_DIR.rglob("*.proto"))
    out.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(s.relative_to(PROTO_DIR)) for s in sources],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = sorted(p for p in out.rglob("*") if p.suffix in {".py", ".pyi"})
    for path in written:
        text = _IMPORT.sub("from dynamo_rl.proto.dynamo.v1 import", path.read_text())
        path.write_text(text)
    for pkg in {out, *(p.parent for p in written)}:
        init = pkg / "__init__.py"
        if not init.exists():
            init.write_text("")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
