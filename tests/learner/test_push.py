"""Weight push to a real embedded engine process, through either engine-control protocol
(rollout.weight_api): after the learner's pushes, the engine serves the learner's weights (its
log-probs for a sequence equal the learner's forward on the same weights), reports the pushed
version, and the version is in Redis."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import redis
import torch

from dynamo_rl import keys
from dynamo_rl.procs import free_port, http_ok
from learner.steplog import read_log
from learner.tiny_model import build_tiny_model
from tests.conftest import dynamo_rl_argv
from tests.learner.helpers import base_overrides, make_groups, run_learner, write_groups

pytestmark = pytest.mark.slow

PROMPT = [72, 101, 108, 108, 111, 44, 32]


def _learner_logprobs(model_dir: Path, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Log-probs of ``tokens`` after ``prompt`` through the learner's own forward."""
    from learner.algorithms import token_logprobs
    from learner.model import load_policy

    model = load_policy(str(model_dir)).eval()
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits, _ = model(ids, torch.ones_like(ids), len(tokens))
        return token_logprobs(logits, torch.tensor([tokens]))[0]


@pytest.mark.parametrize(
    ("transport", "weight_api"),
    [("distributed", "sglang"), ("disk", "sglang"), ("distributed", "vllm")],
)
def test_push_reaches_the_embedded_engine(
    transport: str, weight_api: str, redis_url: str, tmp_path: Path, service
) -> None:
    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=2)
    name = f"push-{transport}-{weight_api}"
    port = free_port()
    service(
        "engine",
        dynamo_rl_argv(
            "engine",
            "--model",
            str(model),
            "--port",
            str(port),
            f"run.name={name}",
            f"endpoints.redis_url={redis_url}",
        ),
        http_ok(f"http://127.0.0.1:{port}/health"),
        timeout=120,
    )
    engine = f"http://127.0.0.1:{port}"
    client = redis.Redis.from_url(redis_url)
    assert engine in {k.decode() for k in client.hkeys(keys.engines_key(name))}

    write_groups(redis_url, name, make_groups(8))
    overrides = [
        *base_overrides(model, tmp_path / "run", redis_url, name),
        "learner.train_batch_size=4",
        "learner.max_steps=2",
        "learner.push.every=1",
        f"learner.push.transport={transport}",
        f"rollout.weight_api={weight_api}",
        "learner.push.fallback_to_disk=false",
        "learner.lr=1e-2",
    ]
    run_learner(2, overrides, tmp_path / "learner.log")

    records = read_log(tmp_path / "run" / "metrics.jsonl")
    assert [r["push_ok"] for r in records] == [True, True], (tmp_path / "learner.log").read_text()
    assert [r["weight_version"] for r in records] == [1, 2]
    assert client.get(keys.weight_version_key(name)) == b"2"
    assert httpx.get(f"{engine}/get_weight_version").json()["weight_version"] == 2
    if weight_api == "vllm":  # pushed through vLLM's routes: its version read agrees
        assert httpx.get(f"{engine}/weight_info").json() == {"weight_version": "2"}
        assert httpx.get(f"{engine}/is_paused").json() == {"is_paused": False}
    registered = json.loads(client.hget(keys.engines_key(name), engine))
    assert registered["weight_version"] == 2
    client.close()

    reply = httpx.post(
        f"{engine}/v1/completions",
        json={
            "prompt": PROMPT,
            "max_tokens": 12,
            "temperature": 1.0,
            "seed": 3,
            "logprobs": 0,
            "return_token_ids": True,
        },
        timeout=60,
    ).json()
    choice = reply["choices"][0]
    tokens, engine_lp = choice["token_ids"], torch.tensor(choice["logprobs"]["token_logprobs"])
    assert len(tokens) > 0
    pushed = _learner_logprobs(tmp_path / "run" / "export" / "final", PROMPT, tokens)
    assert (engine_lp - pushed).abs().max() < 1e-4
    initial = _learner_logprobs(model, PROMPT, tokens)
    assert (engine_lp - initial).abs().max() > 1e-3  # the push changed what the engine serves
