#!/usr/bin/env bash
# The README's first command: set up, then train a tiny model on the built-in arith task with
# DynaMO on this machine's CPU and print held-out accuracy before and after RL.
# Extra arguments are passed to `dynamo-rl up` (e.g. learner.max_steps=30).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/dynamo-rl up --config configs/quickstart.yaml \
  "run.dir=runs/quickstart-$(date +%Y%m%d-%H%M%S)" "$@"
