"""A generation that spans a weight push, checked token by token against the learner: what the
interruptible-update tests of the embedded engine and of the real vLLM server share."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import torch

from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from services.rollout.engines import OpenAICompletionsEngine, Sample


def metric(url: str, name: str) -> float:
    """The sum of a Prometheus metric's samples on ``url``'s ``/metrics`` (0 when absent)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10.0).text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


def learner_logprobs(policy: Any, prompt: Sequence[int], response: Sequence[int]) -> torch.Tensor:
    """The learner's log-probs of ``response`` after ``prompt`` (its forward pass, T = 1)."""
    from learner.algorithms.logits import token_logprobs

    ids = torch.tensor([[*prompt, *response]])
    with torch.no_grad():
        logits, _ = policy(ids, torch.ones_like(ids), len(response))
    return token_logprobs(logits.float(), torch.tensor([list(response)]))[0]


def per_token_gap(sample: Sample, prompt: Sequence[int], policies: dict[int, Any]) -> float:
    """Largest |engine log-prob - learner log-prob| over the sample's tokens, each token scored
    by the policy of the version it says sampled it."""
    versions = sample.weight_versions
    assert versions is not None and len(versions) == len(sample.token_ids)
    assert versions == sorted(versions), f"versions go back within a response: {versions}"
    got = torch.tensor(sample.logprobs)
    want = torch.empty_like(got)
    for v in set(versions):
        full = learner_logprobs(policies[v], prompt, sample.token_ids)
        at = torch.tensor([x == v for x in versions])
        want[at] = full[at]
    return float((got - want).abs().max())


def generate_across_push(
    url: str,
    prompt: Sequence[int],
    checkpoints: Sequence[Any],
    push: Callable[[Any, int], None],
    *,
    weight_api: str,
    running_metric: str | None,
    max_tokens: int,
    tolerance: float,
    first_version: int = 0,
    attempts: int = 6,
) -> tuple[Sample, dict[int, Any]]:
    """Greedy generations of ``max_tokens`` through the rollout client, each with a push of the
    next checkpoint (alternating; the engine serves ``checkpoints[0]`` at ``first_version``) as
    the next version once the request runs, until one generation spans the push. The request
    runs once the engine's ``running_metric`` gauge rises; without one (vLLM updates its gauges
    only at its stats interval, after an idle server has finished hundreds of tokens), once the
    rollout client has sent it: an idle server starts a request as it arrives. Every
    generation's tokens are checked against the learner under each token's version; returns the
    spanning sample and the policy of each version."""
    policies = {first_version: checkpoints[0]}
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    sent = threading.Event()

    async def on_request(request: httpx.Request) -> None:
        if request.url.path == "/v1/completions":
            sent.set()

    async def generate() -> Sample:
        client = OpenAICompletionsEngine(
            url, weight_api=weight_api, continue_aborted=weight_api == "vllm", timeout_s=300.0
        )
        client.http._client.event_hooks["request"].append(on_request)
        try:
            [sample] = await client.generate(prompt, 1, sampling)
        finally:
            await client.aclose()
        return sample

    with ThreadPoolExecutor(1) as pool:
        for k in range(1, attempts + 1):
            version = first_version + k
            before = metric(url, running_metric) if running_metric else 0.0
            sent.clear()

            def running(before: float = before) -> bool:
                if running_metric is None:
                    return sent.is_set()
                return metric(url, running_metric) > before

            in_flight = pool.submit(asyncio.run, generate())
            deadline = time.monotonic() + 120
            while not in_flight.done() and not running():
                assert time.monotonic() < deadline, "the request never started"
                time.sleep(0.01)
            policy = checkpoints[k % len(checkpoints)]
            push(policy, version)
            policies[version] = policy
            sample = in_flight.result(timeout=300)
            assert len(sample.token_ids) == max_tokens, sample.finish_reason
            gap = per_token_gap(sample, prompt, policies)
            assert gap < tolerance, f"engine vs learner log-probs differ by {gap:.2e}"
            if len(set(sample.weight_versions or ())) > 1:
                return sample, policies
    raise AssertionError(f"no generation spanned a push in {attempts} attempts")
