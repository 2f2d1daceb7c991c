"""Both ends of the weight-control contract (dynamo_rl.contracts.weight_control) against each
other, and the engine registry (dynamo_rl.contracts.engine).

The engine end is a real ``dynamo-rl engine`` process; the other ends are the learner's real
push (``learner.push.DistributedPush``, in a one-rank gloo world) and the rollout side's real
clients and registry reader. Each weight protocol (SGLang-shaped, vLLM-shaped) gets an engine of
its own, so the vLLM one is seen before its first update too.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
import torch

from dynamo_rl.contracts.engine import alist_engines, list_engines, parse_registry, registry_value
from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from dynamo_rl.contracts.weight_control import (
    SGLangWeights,
    VLLMWeights,
    WeightControlError,
    read_version,
    send,
    weight_protocol,
)
from dynamo_rl.keys import engines_key
from dynamo_rl.redis_client import async_client, sync_client
from learner.model import load_policy
from learner.push import DistributedPush, discover_engines
from learner.tiny_model import build_tiny_model
from services.rollout.engines import EngineUnavailable, OpenAICompletionsEngine
from tests.services.engine.engine_util import (
    complete,
    load_reference,
    reference_greedy,
    reference_logprobs,
    start_engine,
)

TOKEN = "contract-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ARCH = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}
PROMPT = [50, 60, 70, 80]


# ---- the calls each protocol builds (no server needed) ----------------------------------------


def test_vllm_calls_follow_its_weight_transfer_api() -> None:
    proto = VLLMWeights(pause_mode="abort")
    init = proto.init_group(
        master_address="10.0.0.1", master_port=29500, rank_offset=1, world_size=3,
        group_name="ignored", backend="nccl",
    )  # fmt: skip
    assert (init.method, init.path) == ("POST", "/init_weight_transfer_engine")
    # packed belongs to init_info, for vLLM's nccl backend only (the plugin's gloo backend
    # refuses unknown keys); vLLM picks its backend from --weight-transfer-config.
    assert init.body == {
        "init_info": {
            "master_address": "10.0.0.1",
            "master_port": 29500,
            "rank_offset": 1,
            "world_size": 3,
            "packed": False,
        }
    }
    # Over gloo (the project's vLLM plugin, the embedded engine): flat buckets, no packed.
    assert proto.packs("gloo") and not proto.packs("nccl") and not SGLangWeights().packs("gloo")
    gloo = proto.init_group(
        master_address="10.0.0.1", master_port=29500, rank_offset=1, world_size=2,
        group_name="ignored", backend="gloo", bucket_bytes=4096, timeout_s=30.0,
    )  # fmt: skip
    assert gloo.body == {
        "init_info": {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1,
                      "world_size": 2, "bucket_bytes": 4096, "timeout_s": 30.0}
    }  # fmt: skip
    with pytest.raises(ValueError, match="bucket_bytes"):
        SGLangWeights().init_group(
            master_address="h", master_port=1, rank_offset=1, world_size=2, group_name="g",
            backend="gloo", bucket_bytes=4096,
        )  # fmt: skip
    packed = VLLMWeights(packed=True).init_group(
        master_address="10.0.0.1", master_port=29500, rank_offset=1, world_size=3,
        group_name="ignored", backend="nccl",
    )  # fmt: skip
    assert packed.body["init_info"]["packed"] is True
    update = proto.update(
        names=["w", "b"], dtypes=["bfloat16", "float32"], shapes=[(4, 2), (4,)],
        group_name="g", weight_version=3,
    )  # fmt: skip
    assert (update.path, update.body) == (
        "/update_weights",
        {"update_info": {"names": ["w", "b"], "dtype_names": ["bfloat16", "float32"],
                         "shapes": [[4, 2], [4]]}},
    )  # fmt: skip
    before = [(c.path, c.params) for c in proto.before_update()]
    assert before == [("/pause", {"mode": "abort"}), ("/start_weight_update", {})]
    after = proto.after_update(3)
    assert [c.path for c in after] == ["/finish_weight_update", "/reset_prefix_cache", "/resume"]
    assert after[0].body == {"weight_version": "3"}
    assert [c.path for c in proto.recover()] == ["/resume"]
    assert proto.version_call.path == "/weight_info"
    assert proto.parse_version({"weight_version": "default"}) == 0
    assert proto.parse_version({"weight_version": "12"}) == 12
    with pytest.raises(WeightControlError, match="neither"):
        proto.parse_version({"weight_version": "v12"})
    with pytest.raises(WeightControlError, match="load-from-disk"):
        proto.update_from_disk("/x", 1)
    with pytest.raises(ValueError, match="one entry per tensor"):
        proto.update(names=["w"], dtypes=[], shapes=[(1,)], group_name="g", weight_version=1)
    with pytest.raises(ValueError, match="pause_mode"):
        VLLMWeights(pause_mode="later")  # type: ignore[arg-type]


def test_sglang_calls_and_checks() -> None:
    proto = SGLangWeights()
    assert proto.before_update() == [] and proto.after_update(1) == [] and proto.recover() == []
    update = proto.update(
        names=["w"], dtypes=["float32"], shapes=[(2,)], group_name="g", weight_version=4
    )
    assert update.path == "/update_weights_from_distributed"
    assert update.body == {
        "names": ["w"], "dtypes": ["float32"], "shapes": [[2]], "group_name": "g",
        "weight_version": 4,
    }  # fmt: skip
    assert proto.update_from_disk("/m", 2).body == {"model_path": "/m", "weight_version": 2}
    assert proto.parse_version({"weight_version": "7"}) == 7
    with pytest.raises(WeightControlError, match="not an integer"):
        proto.parse_version({"weight_version": "default"})
    # SGLang reports a failed update as 200 with success false.
    with pytest.raises(WeightControlError, match="boom"):
        proto.check(update, 200, {"success": False, "message": "boom"}, "http://e")
    with pytest.raises(WeightControlError, match="HTTP 409"):
        proto.check(update, 409, {}, "http://e")
    with pytest.raises(ValueError, match="weight_api"):
        weight_protocol("trt")


def test_registry_parsing() -> None:
    entries = {
        b"http://b:1": registry_value("http://b:1", 3).encode(),
        b"http://a:1/": b"not json",  # the field still names the engine
        b"http://c:1": json.dumps({"url": "http://a:1", "weight_version": 5}).encode(),
    }
    parsed = parse_registry(entries)
    assert [e.url for e in parsed] == ["http://a:1", "http://b:1"]  # sorted, one per URL
    assert parsed[1].weight_version == 3 and parsed[1].registered_unix > 0


# ---- against real engine processes ------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("contract")
    # A long context, so a request can still be decoding when a pause cuts it.
    first = build_tiny_model(root / "first", max_positions=4096, **ARCH)
    second = build_tiny_model(root / "second", max_positions=4096, seed=1, **ARCH)
    return first, second


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def engine(
    request: pytest.FixtureRequest,
    models: tuple[Path, Path],
    redis_server: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, str]]:
    """(kind, engine URL, namespace): an engine per protocol, registered in Redis; its tests run
    in this module's order, the first seeing it never updated."""
    kind = request.param
    ns = f"contract-{kind}"
    proc, url = start_engine(
        models[0], tmp_path_factory.mktemp(f"engine-{kind}"),
        f"endpoints.redis_url={redis_server}", f"run.name={ns}",
        "engine.max_new_tokens=4000", env={"DYNAMO_CONTROL_TOKEN": TOKEN},
    )  # fmt: skip
    try:
        yield kind, url, ns
    finally:
        proc.stop()


def _push(protocol_kind: str, url: str, model_dir: Path, version: int, **kw: str) -> object:
    push = DistributedPush(
        master_address="127.0.0.1", bucket_mb=1.0, timeout_s=60.0, headers=AUTH,
        protocol=weight_protocol(protocol_kind, **kw),  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        return push.push(load_policy(str(model_dir)), version, [url])
    finally:
        push.close()


def _paused(url: str) -> bool:
    return bool(httpx.get(f"{url}/is_paused", timeout=10).json()["is_paused"])


def test_learner_push_and_rollout_reads_agree(
    engine: tuple[str, str, str], models: tuple[Path, Path], redis_server: str, one_rank: None
) -> None:
    kind, url, ns = engine
    proto = weight_protocol(kind)
    client = sync_client(redis_server)

    async def rollout_view() -> list:
        aclient = async_client(redis_server)
        try:
            return await alist_engines(aclient, ns)
        finally:
            await aclient.aclose()

    try:
        # Registry: written by the engine, read by the learner and the rollout worker alike.
        assert discover_engines(client, ns) == [url]
        assert [e.url for e in asyncio.run(rollout_view())] == [url]
        if kind == "vllm":  # never updated: vLLM says "default"
            assert httpx.get(f"{url}/weight_info").json() == {"weight_version": "default"}
        assert read_version(proto, url) == 0

        result = _push(kind, url, models[1], 7)
        assert result.ok, result.error  # type: ignore[attr-defined]
        assert read_version(proto, url) == 7
        assert list_engines(client, ns)[0].weight_version == 7
        assert not _paused(url)

        # The rollout side reads the same version through the same protocol object, and the
        # engine now serves the pushed weights.
        rollout = OpenAICompletionsEngine(url, weight_api=kind)

        async def sample() -> tuple[int, list]:
            try:
                greedy = Sampling(max_tokens=12, temperature=0.0)
                return await rollout.weight_version(), await rollout.generate(PROMPT, 1, greedy)
            finally:
                await rollout.aclose()

        version, samples = asyncio.run(sample())
        assert version == 7 and samples[0].weight_version == 7
        pushed = load_reference(models[1])
        assert samples[0].token_ids == reference_greedy(pushed, PROMPT, len(samples[0].token_ids))
        want = reference_logprobs(pushed, PROMPT, samples[0].token_ids)
        assert float((torch.tensor(samples[0].logprobs) - want).abs().max()) < 1e-4
    finally:
        client.close()


def test_a_failed_push_leaves_no_engine_paused(
    engine: tuple[str, str, str], tmp_path: Path, one_rank: None
) -> None:
    kind, url, _ns = engine
    wrong = build_tiny_model(tmp_path / "wrong", hidden_size=16, num_layers=1, num_heads=2,
                             num_kv_heads=1, max_positions=4096)  # fmt: skip
    proto = weight_protocol(kind)
    before = read_version(proto, url)
    result = _push(kind, url, wrong, before + 1)
    assert not result.ok  # type: ignore[attr-defined]
    assert "weights not applied" in result.error  # type: ignore[attr-defined]
    assert read_version(proto, url) == before
    assert not _paused(url)
    assert complete(url, prompt=PROMPT, max_tokens=2).status_code == 200


@pytest.mark.parametrize("engine", ["vllm"], indirect=True)  # vLLM-shaped routes only
def test_vllm_update_needs_a_pause_and_abort_cuts_running_requests(
    engine: tuple[str, str, str],
) -> None:
    _kind, url, _ns = engine
    r = httpx.post(f"{url}/start_weight_update", headers=AUTH)
    assert r.status_code == 409 and "pause" in r.text
    assert httpx.post(f"{url}/pause", params={"mode": "soon"}, headers=AUTH).status_code == 422
    assert httpx.post(f"{url}/pause", params={"mode": "wait"}).status_code == 401

    long = {"prompt": PROMPT, "max_tokens": 4000, "ignore_eos": True, "n": 4,
            "return_token_ids": True, "logprobs": 0}  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(complete, url, 120.0, None, **long)
        deadline = time.monotonic() + 60
        while not _decoding(url):
            assert time.monotonic() < deadline and not running.done()
        r = httpx.post(f"{url}/pause", params={"mode": "abort"}, headers=AUTH, timeout=60)
        assert r.status_code == 200 and _paused(url)
        cut = running.result(timeout=60)
    # Cut requests still answer 200, with truncated output and finish_reason "abort".
    assert cut.status_code == 200
    choices = cut.json()["choices"]
    assert {c["finish_reason"] for c in choices} == {"abort"}
    assert all(len(c["token_ids"]) < 4000 for c in choices)
    # The rollout client refuses such a response (the pool retries it elsewhere or later).
    from services.rollout.engines.openai import parse_choices

    with pytest.raises(EngineUnavailable, match="aborted"):
        parse_choices(cut.json(), url, 4)

    # While paused, new requests wait; resume lets them through.
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(complete, url, 60.0, None, prompt=PROMPT, max_tokens=2)
        assert _paused(url) and not waiting.done()
        assert httpx.post(f"{url}/resume", headers=AUTH).status_code == 200
        assert waiting.result(timeout=60).status_code == 200
    assert not _paused(url)


def _gauge(text: str, name: str) -> float:
    found = re.search(rf"^dynamo_engine_{name} (\S+)$", text, re.M)
    assert found is not None, name
    return float(found.group(1))


def _decoding(url: str) -> bool:
    """A request was received (it is submitted in the same event-loop step) and none is queued:
    it is in the running batch."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return _gauge(text, "requests_in_flight") == 1 and _gauge(text, "queued_sequences") == 0


def test_control_routes_need_the_token(engine: tuple[str, str, str]) -> None:
    _kind, url, _ns = engine
    proto = weight_protocol("vllm")
    for call in [*proto.before_update(), *proto.after_update(1)]:
        with pytest.raises(WeightControlError, match="HTTP 401"):
            send(proto, url, call)
    sglang = SGLangWeights()
    with pytest.raises(WeightControlError, match="HTTP 401"):
        send(sglang, url, sglang.update_from_disk("/nowhere", 1))


def test_registry_entry_goes_when_the_engine_stops(
    models: tuple[Path, Path], redis_url: str, tmp_path: Path
) -> None:
    proc, url = start_engine(models[0], tmp_path, f"endpoints.redis_url={redis_url}",
                             "run.name=contract-stop")  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    try:
        assert [e.url for e in list_engines(client, "contract-stop")] == [url]
        proc.stop()
        assert client.hget(engines_key("contract-stop"), url) is None
    finally:
        client.close()
