"""The embedded engine's generation API against one real engine process (tiny model)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from tests.services.engine.engine_util import (
    complete,
    load_reference,
    reference_greedy,
    reference_logprobs,
    running_engine,
)


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # A long batch window makes "requests that arrive together" reliable on a loaded machine.
    # Raw log-probs: the reference forward passes below are untempered (the default, processed
    # mode is checked against the learner in test_engine_logprobs_mode.py).
    with running_engine(
        model_dir,
        tmp_path_factory.mktemp("engine-api"),
        "engine.logprobs_mode=raw",
        "engine.batch_wait_ms=25",
        "engine.max_new_tokens=200",
        "engine.register_in_redis=false",
    ) as url:
        yield url


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> torch.nn.Module:
    return load_reference(model_dir)


PROMPTS = [[10, 20, 30], [40, 41, 42, 43, 44, 45, 46], [99]]


def test_health_models_version(engine: str) -> None:
    assert httpx.get(f"{engine}/health").status_code == 200
    assert httpx.get(f"{engine}/get_weight_version").json() == {"weight_version": 0}
    data = httpx.get(f"{engine}/v1/models").json()["data"]
    assert data[0]["id"] == "model" and data[0]["max_model_len"] == 256


def test_completion_shape(engine: str) -> None:
    r = complete(
        engine, prompt=PROMPTS[:2], n=3, max_tokens=5, logprobs=0, return_token_ids=True, seed=3
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    for k, c in enumerate(body["choices"]):
        assert c["prompt_token_ids"] == PROMPTS[k // 3]
        assert 1 <= len(c["token_ids"]) <= 5
        assert len(c["logprobs"]["token_logprobs"]) == len(c["token_ids"])
        assert c["finish_reason"] in ("stop", "length")
        assert all(lp <= 0 for lp in c["logprobs"]["token_logprobs"])
    used = sum(len(c["token_ids"]) for c in body["choices"])
    assert body["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": used,
        "total_tokens": 10 + used,
    }
    # Text prompts go through the tokenizer; the char tokenizer maps "ab" to two tokens.
    r = complete(engine, prompt="ab", max_tokens=2, return_token_ids=True)
    assert r.json()["choices"][0]["prompt_token_ids"] == [100, 101]


def test_logprobs_match_fresh_forward(engine: str, reference: torch.nn.Module) -> None:
    """Batched, left-padded, KV-cached decoding returns the log-probs of a plain forward pass."""
    bodies = [
        {"prompt": PROMPTS, "n": 2, "max_tokens": 24, "temperature": 1.0, "seed": 7},
        {"prompt": PROMPTS[1], "max_tokens": 17, "temperature": 0.7, "top_p": 0.9},
        {"prompt": PROMPTS[0], "max_tokens": 9, "temperature": 0.0},
    ]
    # Sent together so they share one batch (different lengths, different sampling params).
    with ThreadPoolExecutor(len(bodies)) as pool:
        futures = [
            pool.submit(complete, engine, logprobs=0, return_token_ids=True, ignore_eos=True, **b)
            for b in bodies
        ]
        responses = [f.result() for f in futures]
    worst = 0.0
    for resp in responses:
        assert resp.status_code == 200, resp.text
        for c in resp.json()["choices"]:
            got = torch.tensor(c["logprobs"]["token_logprobs"])
            want = reference_logprobs(reference, c["prompt_token_ids"], c["token_ids"])
            worst = max(worst, float((got - want).abs().max()))
    assert worst < 1e-4, worst
    greedy = responses[2].json()["choices"][0]["token_ids"]
    assert greedy == reference_greedy(reference, PROMPTS[0], 9)


@torch.inference_mode()
def _ranks(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[int]:
    """Rank of each sampled token among the model's logits at its position (0 = argmax)."""
    logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0]
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
    chosen = rows.gather(1, torch.tensor(tokens)[:, None])
    return (rows > chosen).sum(-1).tolist()


def test_top_k_and_top_p_restrict_sampling(engine: str, reference: torch.nn.Module) -> None:
    prompt = PROMPTS[1]
    common = {"prompt": prompt, "max_tokens": 8, "ignore_eos": True, "return_token_ids": True}
    greedy = reference_greedy(reference, prompt, 8)
    for extra in ({"top_k": 1}, {"top_p": 1e-6}):
        r = complete(engine, temperature=1.0, n=3, **common, **extra).json()
        assert all(c["token_ids"] == greedy for c in r["choices"]), extra
    r = complete(engine, temperature=2.0, n=6, top_k=3, seed=1, **common).json()
    ranks = [k for c in r["choices"] for k in _ranks(reference, prompt, c["token_ids"])]
    assert max(ranks) <= 2 and len(set(ranks)) > 1
    # Without the restriction the same seed reaches further down the distribution.
    r = complete(engine, temperature=2.0, n=6, seed=1, **common).json()
    ranks = [k for c in r["choices"] for k in _ranks(reference, prompt, c["token_ids"])]
    assert max(ranks) > 2


def test_seed_is_reproducible(engine: str) -> None:
    a = complete(engine, prompt=PROMPTS[1], n=2, max_tokens=12, seed=5, return_token_ids=True)
    b = complete(engine, prompt=PROMPTS[1], n=2, max_tokens=12, seed=5, return_token_ids=True)
    c = complete(engine, prompt=PROMPTS[1], n=2, max_tokens=12, seed=6, return_token_ids=True)
    ids = [[ch["token_ids"] for ch in r.json()["choices"]] for r in (a, b, c)]
    assert ids[0] == ids[1]
    assert ids[0] != ids[2]
    assert ids[0][0] != ids[0][1]  # the n samples of one prompt are not copies


def test_stop_token_ids_and_stop_strings(engine: str, reference: torch.nn.Module) -> None:
    prompt = [33, 34, 35, 36]
    greedy = reference_greedy(reference, prompt, 12)
    common = {"prompt": prompt, "temperature": 0, "max_tokens": 12, "return_token_ids": True}
    target = greedy[4]
    r = complete(engine, stop_token_ids=[target], ignore_eos=True, **common).json()["choices"][0]
    first = greedy.index(target)
    assert r["token_ids"] == greedy[: first + 1]
    assert (r["finish_reason"], r["stop_reason"]) == ("stop", target)

    full = complete(engine, ignore_eos=True, **common).json()["choices"][0]
    assert full["token_ids"] == greedy and full["finish_reason"] == "length"
    text = full["text"]
    stop = text[3:5]
    r = complete(engine, stop=[stop], ignore_eos=True, **common).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["stop_reason"] == stop
    assert r["text"] == text[: text.find(stop)]
    assert len(r["token_ids"]) < len(greedy)


def test_request_larger_than_a_batch(engine: str) -> None:
    """n x prompts beyond engine.max_batch_size (64) is split over batches, answered whole."""
    r = complete(engine, prompt=[[7, 8], [9]], n=40, max_tokens=2, ignore_eos=True)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == list(range(80))
    assert r.json()["usage"]["completion_tokens"] == 160


def test_max_tokens_zero(engine: str) -> None:
    c = complete(engine, prompt=[5, 6], max_tokens=0, return_token_ids=True).json()["choices"][0]
    assert c["token_ids"] == [] and c["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": [1, 2], "n": 0}, "n"),
        ({"prompt": [1, 2], "max_tokens": -1}, "max_tokens"),
        ({"prompt": [1, 2], "bogus": 1}, "bogus"),
        ({"prompt": [1, 2], "max_token": 3}, "max_token"),
        ({"prompt": [1, 100000]}, "prompt"),
        ({"prompt": [[1, 2], [259]]}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1], "stop_token_ids": [5000]}, "stop_token_ids"),
        ({"prompt": [1], "max_tokens": 201}, "max_tokens"),
        ({"prompt": [1] * 250, "max_tokens": 10}, "max_tokens"),
        ({"prompt": [1], "logprobs": 6}, "logprobs"),
        ({"prompt": [1], "top_p": 0}, "top_p"),
        ({"prompt": [1], "temperature": -1}, "temperature"),
        ({"prompt": [1], "stream": True}, "stream"),
        ({"prompt": [1], "stop": ["x", ""]}, "stop"),
    ],
)
def test_bad_requests_name_the_field(engine: str, body: dict, field: str) -> None:
    r = httpx.post(f"{engine}/v1/completions", json=body, timeout=30)
    assert r.status_code == 422, r.text
    err = r.json()
    assert field in err["detail"][0]["loc"], err
    assert err["error"]["param"] == field


def test_sglang_generate(engine: str, reference: torch.nn.Module) -> None:
    r = httpx.post(
        f"{engine}/generate",
        json={
            "input_ids": PROMPTS[0],
            "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    one = r.json()
    assert isinstance(one, dict)
    assert one["output_ids"] == reference_greedy(reference, PROMPTS[0], 6)
    meta = one["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert [t for _lp, t, _ in meta["output_token_logprobs"]] == one["output_ids"]
    got = torch.tensor([lp for lp, _t, _ in meta["output_token_logprobs"]])
    want = reference_logprobs(reference, PROMPTS[0], one["output_ids"])
    assert float((got - want).abs().max()) < 1e-4
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 6

    r = httpx.post(
        f"{engine}/generate",
        json={"text": ["ab", "cd"], "sampling_params": {"max_new_tokens": 3, "n": 2}},
        timeout=30,
    )
    batch = r.json()
    assert isinstance(batch, list) and len(batch) == 4
    assert all("output_token_logprobs" not in b["meta_info"] for b in batch)

    r = httpx.post(f"{engine}/generate", json={"text": "a", "input_ids": [1]}, timeout=30)
    assert r.status_code == 422 and "text" in r.json()["detail"][0]["loc"]
    r = httpx.post(
        f"{engine}/generate",
        json={"input_ids": [1], "sampling_params": {"n": 0}},
        timeout=30,
    )
    assert r.status_code == 422 and "n" in r.json()["detail"][0]["loc"]


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_concurrent_requests_share_batches_and_metrics(engine: str) -> None:
    before = httpx.get(f"{engine}/metrics").text
    batches0 = _metric(before, "dynamo_engine_batch_sequences_count")
    tokens0 = _metric(before, "dynamo_engine_generated_tokens_total")
    n_requests = 8
    with ThreadPoolExecutor(n_requests) as pool:
        futures = [
            pool.submit(complete, engine, prompt=[i + 3, 7], max_tokens=4, ignore_eos=True)
            for i in range(n_requests)
        ]
        assert all(f.result().status_code == 200 for f in futures)
    after = httpx.get(f"{engine}/metrics").text
    batches = _metric(after, "dynamo_engine_batch_sequences_count") - batches0
    assert 1 <= batches < n_requests  # decoded together, not one batch per request
    assert _metric(after, "dynamo_engine_generated_tokens_total") - tokens0 == 4 * n_requests
    assert 'dynamo_engine_requests_total{route="/v1/completions",status="422"}' in after
