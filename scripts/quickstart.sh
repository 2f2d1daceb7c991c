#!/usr/bin/env bash
# The README's first command: set up, then run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Until the end-to-end path lands: validate the shipped configs and run the smoke tests against a
# real Redis server.
.venv/bin/python -m pip -q install "pytest>=8,<10"
.venv/bin/python -m pytest -q tests/dynamo_rl
