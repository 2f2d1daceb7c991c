"""``engine.batching`` on a real engine process: with ``continuous`` a request that arrives while a
long generation decodes joins its batch and is answered before it ends (with ``static`` it waits
for the batch), every token's log-prob is still a fresh forward pass's across the join, and a
waiting update queued before the request stops the joining: the batch drains, the update runs,
and the request is served by the new weights."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from learner.tiny_model import build_tiny_model
from tests.services.engine.engine_util import (
    complete,
    load_reference,
    reference_greedy,
    reference_logprobs,
    running_engine,
)
from tests.services.engine.interrupt_util import metric

pytestmark = pytest.mark.slow
ARCH = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}
LONG = {"prompt": [50, 60, 70, 80], "max_tokens": 1800}
SHORT = {"prompt": [3, 4, 5], "max_tokens": 4}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("batching-models")
    return [build_tiny_model(root / f"seed{s}", seed=s, max_positions=2048, **ARCH) for s in (0, 1)]


@pytest.fixture(scope="module", params=["static", "continuous"])
def engine(
    request: pytest.FixtureRequest, models: list[Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    with running_engine(
        models[0],
        tmp_path_factory.mktemp(f"engine-{request.param}"),
        f"engine.batching={request.param}",
        "engine.register_in_redis=false",
        "engine.max_new_tokens=2000",
    ) as url:
        yield url, request.param


def _greedy(url: str, body: dict) -> dict:
    """The choice, with ``answered_at``: when its answer came back (``time.monotonic``)."""
    r = complete(url, timeout=300, temperature=0, ignore_eos=True, logprobs=0,
                 return_token_ids=True, **body)  # fmt: skip
    answered_at = time.monotonic()
    assert r.status_code == 200, r.text
    return {**r.json()["choices"][0], "answered_at": answered_at}


def _start_long(pool: ThreadPoolExecutor, url: str) -> Future:
    """The long generation, once the engine decodes it (in flight, nothing queued)."""
    done_before = metric(url, "dynamo_engine_requests_total")
    fut = pool.submit(_greedy, url, LONG)
    deadline = time.monotonic() + 60
    while not (
        metric(url, "dynamo_engine_requests_in_flight") >= 1
        and metric(url, "dynamo_engine_queued_sequences") == 0
    ):
        assert time.monotonic() < deadline, "the long generation never started"
        assert metric(url, "dynamo_engine_requests_total") == done_before, "it ended at once"
        time.sleep(0.01)
    return fut


def test_a_request_joins_a_running_batch_only_when_continuous(
    engine: tuple[str, str], models: list[Path]
) -> None:
    url, batching = engine
    reference = load_reference(models[0])
    with ThreadPoolExecutor(2) as pool:
        long = _start_long(pool, url)
        short = _greedy(url, SHORT)
        got = long.result(timeout=300)
    # continuous: answered while the long generation still decodes (it has over a thousand tokens
    # to go); static: after its batch. The margin covers a late wake-up of either client thread.
    ahead = got["answered_at"] - short["answered_at"]
    if batching == "continuous":
        assert ahead > 0.5, f"the short request was answered {ahead:.3f} s before the long one"
    else:
        assert ahead < 0.5, f"the short request was answered {ahead:.3f} s before the long one"
    assert short["token_ids"] == reference_greedy(reference, SHORT["prompt"], SHORT["max_tokens"])
    for body, choice in ((SHORT, short), (LONG, got)):
        tokens = choice["token_ids"]
        assert len(tokens) == body["max_tokens"]
        want = reference_logprobs(reference, body["prompt"], tokens)
        gap = max(
            abs(a - b)
            for a, b in zip(choice["logprobs"]["token_logprobs"], want.tolist(), strict=True)
        )
        assert gap < 1e-3, f"{batching}: log-probs off by {gap} across the join"


def test_a_waiting_update_stops_joining(engine: tuple[str, str], models: list[Path]) -> None:
    """The update (queued first) runs once the batch drains, then the request, on new weights."""
    url, batching = engine
    before = int(metric(url, "dynamo_engine_weight_version"))
    with ThreadPoolExecutor(3) as pool:
        long = _start_long(pool, url)
        update = pool.submit(
            httpx.post, f"{url}/update_weights_from_disk",
            json={"model_path": str(models[1]), "weight_version": before + 1}, timeout=300,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while metric(url, "dynamo_engine_queued_tasks") < 1:
            assert time.monotonic() < deadline, "the update never queued"
            assert not long.done(), "the long generation ended before the update queued"
            time.sleep(0.01)
        short = _greedy(url, SHORT)
        got = long.result(timeout=300)
        assert update.result().status_code == 200
    # The request ran after the update, which ran after the long generation's batch drained.
    assert set(got["weight_versions"]) == {before}
    assert set(short["weight_versions"]) == {before + 1}, f"{batching}: it joined the batch"
    # Back to the first weights for the other tests of this module's engine.
    back = {"model_path": str(models[0]), "weight_version": before + 2}
    r = httpx.post(f"{url}/update_weights_from_disk", json=back, timeout=60)
    assert r.status_code == 200, r.text
