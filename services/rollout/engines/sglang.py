"""Client of SGLang's native ``POST /generate`` (SGLang servers and the embedded engine).

Request: ``input_ids``, ``sampling_params`` (``n``, ``max_new_tokens``, ``temperature``, ``top_p``,
``top_k``, ``stop``, ``stop_token_ids``, ``sampling_seed``) and ``return_logprob: true``. The answer
is one object (``n`` = 1) or a list of ``n``, each with ``output_ids``, ``text`` and
``meta_info.output_token_logprobs`` as ``[logprob, token_id, text]`` triples; ``meta_info``
also carries ``finish_reason`` (``{"type": "stop" | "length" | "abort", ...}``) and, on recent
SGLang, ``weight_version``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dynamo_rl.contracts.engine import SGLangWeights
from services.rollout.engines._http import HTTPReplica, read_weight_version
from services.rollout.engines.base import EngineProtocolError, Sample, Sampling

__all__ = ["SGLangEngine", "generate_payload", "parse_generate"]


def generate_payload(prompt_token_ids: Sequence[int], n: int, sampling: Sampling) -> dict[str, Any]:
    params: dict[str, Any] = {
        "n": n,
        "max_new_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    if sampling.top_k > 0:
        params["top_k"] = sampling.top_k
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.stop_token_ids:
        params["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    return {"input_ids": list(prompt_token_ids), "sampling_params": params, "return_logprob": True}


def _finish_reason(meta: dict[str, Any]) -> str:
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):
        return str(reason.get("type") or "stop")
    return str(reason or "stop")


def parse_generate(body: Any, url: str, n: int) -> list[Sample]:
    items = body if isinstance(body, list) else [body]
    if len(items) != n:
        raise EngineProtocolError(f"{url}: asked /generate for {n} samples, got {len(items)}")
    samples = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("meta_info"), dict):
            raise EngineProtocolError(f"{url}: /generate item has no meta_info")
        meta = item["meta_info"]
        triples = meta.get("output_token_logprobs")
        if triples is None:
            raise EngineProtocolError(f"{url}: meta_info has no output_token_logprobs")
        logprobs = [float(t[0]) for t in triples]
        token_ids = item.get("output_ids")
        if token_ids is None:
            token_ids = [int(t[1]) for t in triples]
        if len(token_ids) != len(logprobs):
            raise EngineProtocolError(
                f"{url}: {len(token_ids)} output ids but {len(logprobs)} log-probs in one sample"
            )
        version = meta.get("weight_version")
        try:
            weight_version = None if version is None else int(version)
        except (TypeError, ValueError):
            weight_version = None
        samples.append(
            Sample(
                token_ids=[int(t) for t in token_ids],
                logprobs=logprobs,
                text=item.get("text") or "",
                finish_reason=_finish_reason(meta),
                weight_version=weight_version,
                engine_url=url,
            )
        )
    return samples


class SGLangEngine:
    """One replica behind SGLang's native ``/generate`` and weight-update endpoints."""

    def __init__(
        self, url: str, *, timeout_s: float = 600.0, control_token: str | None = None
    ) -> None:
        self.http = HTTPReplica(url, timeout_s=timeout_s, control_token=control_token)
        self.url = self.http.url
        self.weights = SGLangWeights()

    async def generate(
        self, prompt_token_ids: Sequence[int], n: int, sampling: Sampling
    ) -> list[Sample]:
        body = await self.http.request(
            "POST", "/generate", generate_payload(prompt_token_ids, n, sampling)
        )
        return parse_generate(body, self.url, n)

    async def weight_version(self) -> int:
        return await read_weight_version(self.http, self.weights)

    async def health(self) -> bool:
        return await self.http.ok("/health")

    async def aclose(self) -> None:
        await self.http.aclose()
