"""Client of SGLang's native ``POST /generate`` (SGLang servers and the embedded engine).

Request: ``input_ids``, ``sampling_params`` (``n``, ``max_new_tokens``, ``temperature``, ``top_p``,
``top_k``, ``stop``, ``stop_token_ids``, ``sampling_seed``) and ``return_logprob: true``. The answer
is one object (``n`` = 1) or a list of ``n``, each with ``output_ids``, ``text`` and
``meta_info.output_token_logprobs`` as ``[logprob, token_id, text]`` triples; ``meta_info``
also carries ``finish_reason`` (``{"type": "stop" | "length" | "abort", ...}``) and, on recent
SGLang, ``weight_version``. Requests and answers are the models of :mod:`dynamo_rl.contracts.engine`
(:class:`~dynamo_rl.contracts.engine.GenerateRequest`,
:class:`~dynamo_rl.contracts.engine.GenerateItem`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from dynamo_rl.contracts.engine import (
    GenerateItem,
    GenerateRequest,
    SGLangSampling,
    sampling_knobs,
)
from dynamo_rl.contracts.sampling import SamplingParams
from dynamo_rl.contracts.weight_control import SGLangWeights
from services.rollout.engines._http import (
    ReplicaClient,
    build_request,
    parse_answer,
    token_versions,
)
from services.rollout.engines.base import EngineProtocolError, Sample

__all__ = ["SGLangEngine", "generate_request", "parse_generate"]

_ITEMS = TypeAdapter(list[GenerateItem])


def generate_request(
    prompt_token_ids: Sequence[int],
    n: int,
    sampling: SamplingParams,
    url: str = "",
    lora_path: str | None = None,
) -> GenerateRequest:
    def build() -> GenerateRequest:
        params = SGLangSampling(
            n=n, max_new_tokens=sampling.max_tokens, sampling_seed=sampling.seed,
            **sampling_knobs(sampling),
        )  # fmt: skip
        return GenerateRequest(
            input_ids=list(prompt_token_ids), sampling_params=params, return_logprob=True,
            lora_path=lora_path,
        )  # fmt: skip

    return build_request(f"{url}/generate", build)


def parse_generate(body: Any, url: str, n: int) -> list[Sample]:
    items = parse_answer(_ITEMS, body if isinstance(body, list) else [body], f"{url}/generate")
    if len(items) != n:
        raise EngineProtocolError(f"{url}: asked /generate for {n} samples, got {len(items)}")
    samples = []
    for item in items:
        meta = item.meta_info
        triples = meta.output_token_logprobs
        if triples is None:
            raise EngineProtocolError(f"{url}: meta_info has no output_token_logprobs")
        logprobs = [t[0] for t in triples]
        token_ids = item.output_ids
        if token_ids is None:
            token_ids = [t[1] for t in triples]
        if len(token_ids) != len(logprobs):
            raise EngineProtocolError(
                f"{url}: {len(token_ids)} output ids but {len(logprobs)} log-probs in one sample"
            )
        samples.append(
            Sample(
                token_ids=token_ids,
                logprobs=logprobs,
                text=item.text or "",
                finish_reason=meta.finish(),
                weight_version=meta.weight_version,
                engine_url=url,
                weight_versions=token_versions(meta.weight_versions, len(token_ids), url),
            )
        )
    return samples


class SGLangEngine(ReplicaClient):
    """One replica behind SGLang's native ``/generate`` and weight-update endpoints."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 600.0,
        control_token: str | None = None,
        adapter: str | None = None,
    ) -> None:
        super().__init__(url, SGLangWeights(), timeout_s=timeout_s, control_token=control_token,
                         adapter=adapter)  # fmt: skip

    async def generate(
        self, prompt_token_ids: Sequence[int], n: int, sampling: SamplingParams
    ) -> list[Sample]:
        adapter, version = await self.adapter_to_use()
        request = generate_request(prompt_token_ids, n, sampling, self.url, lora_path=adapter)
        body = await self.http.request("POST", "/generate", request.body())
        samples = parse_generate(body, self.url, n)
        if adapter is not None:  # the adapter named is the version they were drawn with
            for sample in samples:
                sample.weight_version = version
        return samples
