# DynaMO-RL, CPU image. One image for every role; the role is the command:
#   dynamo-rl allocator | reward | engine | rollout | dashboard | task
#   torchrun ... -m dynamo_rl.cli learner   (k8s: python -m learner.node ..., torchrun per node)
# Runs as the unprivileged uid 10001. bubblewrap is here for the reward service's code sandbox
# (see docs/deploy.md for what the container runtime must allow for it).
# Build: docker build -t dynamo-rl:latest .          (CUDA: docker build -f Dockerfile.cuda ...)
# With no registry (CI): scripts/docker_local.sh builds local base images and passes
#   --build-arg PYTHON_IMAGE=dynamo-rl-base/python:3.11 --build-arg TORCH_FIND_LINKS=<wheel folder URL>
# No `# syntax=` line: BuildKit would pull its frontend for it, and offline it cannot.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# torch first and pinned, from the CPU index, so the project's torch range cannot pull a CUDA build.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# A folder or URL holding the torch CPU wheel, used instead of TORCH_INDEX_URL when PyTorch's index
# is unreachable (torch's own dependencies then come from the default index).
ARG TORCH_FIND_LINKS=

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap tini ca-certificates \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --gid 10001 dynamo \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/dynamo \
      --shell /usr/sbin/nologin dynamo \
 && mkdir -p /data && chown 10001:10001 /data

RUN if [ -n "${TORCH_FIND_LINKS}" ]; then \
      pip install --find-links "${TORCH_FIND_LINKS}" "torch==${TORCH_VERSION}+cpu"; \
    else \
      pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"; \
    fi

WORKDIR /opt/dynamo-rl
# Metadata first: the dependency layer is rebuilt only when pyproject.toml (or README.md) changes.
# Installing the project without its packages pulls every dependency; the code layer then
# installs only the project itself.
COPY pyproject.toml README.md ./
RUN pip install . && pip uninstall -y dynamo-rl
COPY dynamo_rl ./dynamo_rl
COPY allocator ./allocator
COPY learner ./learner
COPY services ./services
COPY launcher ./launcher
COPY dashboard ./dashboard
COPY tasks ./tasks
RUN pip install --no-deps . \
 && python -c "import dynamo_rl, launcher, dashboard, tasks, torch, transformers" \
 && dynamo-rl --help > /dev/null

USER 10001:10001
ENV HOME=/home/dynamo \
    HF_HOME=/home/dynamo/.cache/huggingface \
    OMP_NUM_THREADS=4
WORKDIR /data
# tini reaps orphans (sandboxed programs, torchrun workers) and forwards SIGTERM to the service.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["dynamo-rl", "--help"]
