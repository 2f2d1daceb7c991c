"""Weight updates of a real engine process: a gloo broadcast from this test (rank 0 per
docs/contracts.md), a reload from disk, the bearer token, and the Redis registration."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
import torch
import torch.distributed as dist

from dynamo_rl.keys import engines_key
from dynamo_rl.procs import free_port
from learner.tiny_model import build_tiny_model
from tests.services.engine.engine_util import (
    complete,
    load_reference,
    reference_greedy,
    reference_logprobs,
    running_engine,
)

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NS = "engine-weights"
ARCH = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", **ARCH)


@pytest.fixture(scope="module")
def engine(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory, redis_server: str
) -> Iterator[str]:
    with running_engine(
        model_dir,
        tmp_path_factory.mktemp("engine-weights"),
        f"endpoints.redis_url={redis_server}",
        f"run.name={NS}",
        env={"DYNAMO_CONTROL_TOKEN": TOKEN},
    ) as url:
        yield url


class Rank0:
    """The learner's side of the contract, written out here from docs/contracts.md."""

    def __init__(self, url: str, group_name: str = "wg") -> None:
        self.url = url
        self.group_name = group_name
        self.pool = ThreadPoolExecutor(2)
        port = free_port()
        timeout = datetime.timedelta(seconds=60)
        reply = self.pool.submit(
            httpx.post,
            f"{url}/init_weights_update_group",
            json={
                "master_address": "127.0.0.1",
                "master_port": port,
                "rank_offset": 1,
                "world_size": 2,
                "group_name": group_name,
                "backend": "gloo",
            },
            headers=AUTH,
            timeout=90,
        )
        self.store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, timeout=timeout)
        self.group = dist.ProcessGroupGloo(dist.PrefixStore(group_name, self.store), 0, 2, timeout)
        r = reply.result()
        assert r.status_code == 200 and r.json()["success"], r.text

    def push(self, tensors: dict[str, torch.Tensor], version: int | None) -> httpx.Response:
        body = {
            "names": list(tensors),
            "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors.values()],
            "shapes": [list(t.shape) for t in tensors.values()],
            "group_name": self.group_name,
            "weight_version": version,
        }
        reply = self.pool.submit(
            httpx.post,
            f"{self.url}/update_weights_from_distributed",
            json=body,
            headers=AUTH,
            timeout=120,
        )
        for t in tensors.values():  # exactly in the order of names
            self.group.broadcast(t.contiguous(), 0).wait()
        return reply.result()


def registered(redis_url: str, url: str) -> dict | None:
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.hget(engines_key(NS), url)
    finally:
        client.close()
    return None if raw is None else json.loads(raw)


def version(url: str) -> int:
    return httpx.get(f"{url}/get_weight_version").json()["weight_version"]


def test_registers_in_redis(engine: str, redis_server: str) -> None:
    entry = registered(redis_server, engine)
    assert entry is not None
    assert entry["url"] == engine and entry["weight_version"] == version(engine)
    assert abs(entry["registered_unix"] - time.time()) < 600


def test_control_endpoints_need_the_token(engine: str, tmp_path: Path) -> None:
    body = {"model_path": str(tmp_path)}
    url = f"{engine}/update_weights_from_disk"
    assert httpx.post(url, json=body).status_code == 401
    bad = {"Authorization": "Bearer nope"}
    assert httpx.post(url, json=body, headers=bad).status_code == 401
    r = httpx.post(f"{engine}/update_weights_from_distributed", json={}, headers=bad)
    assert r.status_code == 401
    # Generation needs no token.
    assert complete(engine, prompt=[1, 2], max_tokens=1).status_code == 200
    # With the token, a bad path is the caller's mistake, named.
    r = httpx.post(url, json=body, headers=AUTH)
    assert r.status_code == 400 and "model_path" in r.json()["message"]


def test_vllm_nccl_packed_layout_is_refused_naming_the_field(engine: str) -> None:
    """The contract carries ``packed`` (real vLLM's nccl backend takes it); this engine does not."""
    info = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2,
            "packed": True}  # fmt: skip
    r = httpx.post(f"{engine}/init_weight_transfer_engine", json={"init_info": info}, headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "init_info", "packed"]


def test_distributed_update_changes_outputs_and_version(
    engine: str, model_dir: Path, redis_server: str
) -> None:
    prompt = [50, 60, 70, 80]
    greedy = {"prompt": prompt, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    long_request = {**greedy, "max_tokens": 160}
    before = complete(engine, **long_request).json()["choices"][0]["token_ids"]
    v0 = version(engine)

    new = load_reference(model_dir)
    torch.manual_seed(123)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.5)
        # One tensor travels as bfloat16 (the engine casts on load): round it here as well.
        new.model.norm.weight.copy_(new.model.norm.weight.to(torch.bfloat16).float())
    tensors = dict(new.state_dict())
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.bfloat16)

    rank0 = Rank0(engine)
    # A request in flight while the push happens must come from one version, never a mix.
    in_flight = rank0.pool.submit(complete, engine, **long_request)
    time.sleep(0.1)
    r = rank0.push(tensors, version=v0 + 5)
    assert r.status_code == 200 and r.json()["success"], r.text
    assert version(engine) == v0 + 5
    assert registered(redis_server, engine)["weight_version"] == v0 + 5

    after = complete(engine, logprobs=0, **long_request).json()
    choice = after["choices"][0]
    assert after["weight_version"] == v0 + 5
    assert choice["token_ids"] != before
    assert choice["token_ids"][:20] == reference_greedy(new, prompt, 20)
    got = torch.tensor(choice["logprobs"]["token_logprobs"])
    want = reference_logprobs(new, prompt, choice["token_ids"])
    assert float((got - want).abs().max()) < 1e-4

    mid = in_flight.result().json()
    expected = {v0: before, v0 + 5: choice["token_ids"]}
    assert mid["choices"][0]["token_ids"] == expected[mid["weight_version"]]

    # A push that does not fit the model is received in full, then refused as a whole.
    bad = {"model.norm.weight": torch.ones(7), "lm_head.weight": tensors["lm_head.weight"]}
    r = rank0.push(bad, version=v0 + 6)
    assert r.status_code == 400 and "model.norm.weight" in r.json()["message"]
    assert version(engine) == v0 + 5

    # Bad bodies are refused before anything is received.
    r = httpx.post(
        f"{engine}/update_weights_from_distributed",
        json={"names": ["x"], "dtypes": ["float33"], "shapes": [[1]], "group_name": "wg"},
        headers=AUTH,
    )
    assert r.status_code == 422 and r.json()["error"]["param"] == "dtypes.0"
    r = httpx.post(
        f"{engine}/update_weights_from_distributed",
        json={"names": ["x"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "nope"},
        headers=AUTH,
    )
    assert r.status_code == 400 and "nope" in r.json()["message"]


def test_update_from_disk(engine: str, tmp_path: Path) -> None:
    other = build_tiny_model(tmp_path / "other", seed=1, **ARCH)
    r = httpx.post(
        f"{engine}/update_weights_from_disk",
        json={"model_path": str(other), "weight_version": 9},
        headers=AUTH,
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["success"], r.text
    assert version(engine) == 9
    prompt = [3, 4, 5]
    c = complete(engine, prompt=prompt, max_tokens=10, temperature=0, ignore_eos=True,
                 return_token_ids=True)  # fmt: skip
    assert c.json()["choices"][0]["token_ids"] == reference_greedy(
        load_reference(other), prompt, 10
    )
