"""Inference engine clients: the :class:`Engine` protocol, the OpenAI-compatible and
SGLang-native clients, and the replica pool.

:func:`make_engine` builds one replica's client from the rollout config's ``engine_api`` and
``weight_api`` (the weight-control protocol of :mod:`dynamo_rl.contracts.weight_control`, which
reads versions).
"""

from __future__ import annotations

from services.rollout.engines.base import (
    Engine,
    EngineError,
    EngineProtocolError,
    EngineRequestError,
    EngineUnavailable,
    Sample,
)
from services.rollout.engines.openai import OpenAICompletionsEngine
from services.rollout.engines.pool import EnginePool
from services.rollout.engines.sglang import SGLangEngine

__all__ = [
    "Engine",
    "EngineError",
    "EnginePool",
    "EngineProtocolError",
    "EngineRequestError",
    "EngineUnavailable",
    "OpenAICompletionsEngine",
    "SGLangEngine",
    "Sample",
    "make_engine",
]


def make_engine(
    url: str,
    *,
    engine_api: str = "openai",
    weight_api: str = "sglang",
    model: str | None = None,
    timeout_s: float = 600.0,
    control_token: str | None = None,
    adapter: str | None = None,
    continue_aborted: bool = False,
) -> OpenAICompletionsEngine | SGLangEngine:
    """A client of one replica speaking ``engine_api`` ("openai" | "sglang"); ``adapter``: the
    LoRA adapters' name (``learner.lora.name``) whose newest version requests name;
    ``continue_aborted``: see :class:`OpenAICompletionsEngine` (vLLM-shaped weight control)."""
    if engine_api == "openai":
        return OpenAICompletionsEngine(
            url, model=model, weight_api=weight_api, timeout_s=timeout_s,
            control_token=control_token, adapter=adapter,
            continue_aborted=continue_aborted and weight_api == "vllm",
        )  # fmt: skip
    if engine_api == "sglang":
        if weight_api != "sglang":
            raise ValueError(
                "engine_api 'sglang' uses SGLang's weight endpoints (weight_api sglang)"
            )
        return SGLangEngine(url, timeout_s=timeout_s, control_token=control_token, adapter=adapter)
    raise ValueError(f"engine_api must be 'openai' or 'sglang', got {engine_api!r}")
