#!/usr/bin/env bash
# The lint CI runs and you run by hand: ruff check, ruff format --check, import-linter contracts.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
"$bin/ruff" check .
"$bin/ruff" format --check .
"$bin/lint-imports"
