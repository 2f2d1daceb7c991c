"""Helpers for the embedded-engine tests: start a real engine process, reference forward passes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import torch

from dynamo_rl.procs import ServiceProcess
from dynamo_rl.service_table import SERVICES
from tests.conftest import REPO

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""A chat template for the tiny models (whose tokenizer has none): the chat tests save it with
the tokenizer, for the embedded engine and for real vLLM alike."""


def start_engine(
    model_dir: Path, log_dir: Path, *overrides: str, env: dict[str, str] | None = None
) -> tuple[ServiceProcess, str]:
    """``dynamo-rl engine`` on a free port; returns the process and its base URL."""
    import os

    # A token in the developer's environment must not leak into tests that expect none.
    inherited = {k: v for k, v in os.environ.items() if k != "DYNAMO_CONTROL_TOKEN"}
    full_env = {**inherited, "OMP_NUM_THREADS": "1", **(env or {})}
    return SERVICES["engine"].start(
        log_dir / "engine.log", "--model", str(model_dir), *overrides, env=full_env, cwd=REPO,
        timeout=120,
    )  # fmt: skip


@contextlib.contextmanager
def running_engine(
    model_dir: Path, log_dir: Path, *overrides: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """:func:`start_engine` for the length of a ``with`` block: its base URL, stopped at the end."""
    proc, url = start_engine(model_dir, log_dir, *overrides, env=env)
    try:
        yield url
    finally:
        proc.stop()


def load_reference(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@torch.inference_mode()
def reference_logprobs(
    model: torch.nn.Module, prompt: Sequence[int], tokens: Sequence[int]
) -> torch.Tensor:
    """Log-probs of ``tokens`` after ``prompt`` from one unpadded, uncached forward pass."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    n = len(prompt)
    return logp[n - 1 : n - 1 + len(tokens)].gather(1, torch.tensor(tokens)[:, None])[:, 0]


@torch.inference_mode()
def reference_greedy(model: torch.nn.Module, prompt: Sequence[int], steps: int) -> list[int]:
    """Greedy continuation by full forward passes (no cache, no padding)."""
    ids = list(prompt)
    for _ in range(steps):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def complete(
    url: str, timeout: float = 60.0, headers: dict | None = None, **body
) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=timeout, headers=headers)
