"""Reward models, LLM judges and composite rewards, against real processes.

One module-wide set of servers: the embedded engine serving a tiny causal LM built to answer
``7`` to anything (the judge), a tiny chat server that sleeps or fails on purpose
(``judge_stub.py``), and a reward server whose config has a reward model built here, four judges
and two composite specs.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml

from dynamo_rl.procs import ServiceProcess, free_port, http_ok
from learner.tiny_model import build_char_tokenizer
from tests.conftest import REPO
from tests.services.engine.engine_util import start_engine
from tests.services.reward.conftest import RewardServer, start_reward_server

PROMPTS = ["1+1=", "What is the capital of France?", "Say hi.", "x", "2*3=", "Count to three"]
RESPONSES = ["2", "Paris, of course.", "hi", "y" * 30, "six", "one two three"]


def build_reward_model(out: Path) -> Path:
    """A randomly initialised Qwen2 sequence-classification model with one label."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    tok = build_char_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
        num_labels=1, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(1)
    model = Qwen2ForSequenceClassification(cfg)
    with torch.no_grad():
        model.score.weight.mul_(20)  # spread the scores so batching mistakes would show
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_sevens_model(out: Path) -> Path:
    """A causal LM whose greedy answer is always '7': every token embeds to the same vector,
    attention and MLP outputs are zero, and only the '7' row of the head is non-zero."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_char_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
        tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    (seven,) = tok.encode("7")
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        model.lm_head.weight[seven] = 1.0
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_reward_model(tmp_path_factory.mktemp("rm") / "rm")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, rm_dir: Path) -> Iterator[RewardServer]:
    logs = tmp_path_factory.mktemp("composite")
    judge_model = build_sevens_model(logs / "sevens")
    engine, engine_url = start_engine(judge_model, logs)
    stub_port = free_port()
    stub = ServiceProcess(
        "judge-stub",
        [sys.executable, str(Path(__file__).with_name("judge_stub.py")), str(stub_port)],
        logs / "stub.log",
        cwd=REPO,
    ).start()
    stub_url = f"http://127.0.0.1:{stub_port}"
    reward = None
    try:
        stub.wait_ready(http_ok(f"{stub_url}/health"), timeout=30)
        config = {
            "reward": {
                "math": {"workers": 1},
                "code": {"enabled": False},
                "models": {"rm": {"path": str(rm_dir), "batch_size": 4, "batch_wait_ms": 200}},
                "judges": {
                    "engine": {
                        "url": engine_url,
                        "api": "completions",
                        "score_pattern": r"(\d)",
                        "max_tokens": 1,
                        "retries": 0,
                    },
                    "strict": {
                        "url": engine_url,
                        "api": "completions",
                        "max_tokens": 3,
                        "retries": 0,
                    },
                    "slow": {
                        "url": f"{stub_url}/slow",
                        "timeout_s": 1,
                        "retries": 1,
                        "retry_backoff_s": 0,
                    },
                    "flaky": {
                        "url": f"{stub_url}/flaky",
                        "retries": 2,
                        "retry_backoff_s": 0,
                        "system": "You are a strict grader.",
                    },
                },
                "composite": {
                    "gsm": {
                        "components": [
                            {"kind": "math"},
                            {"kind": "model", "weight": 0.5, "gate": "math"},
                            {"kind": "length", "max_length": 20, "buffer": 10},
                            {"kind": "format", "pattern": r"^Let's", "weight": 0.25},
                        ]
                    },
                    "chat": {
                        "components": [
                            {"kind": "judge", "judge": "engine"},
                            {"name": "rm", "kind": "model", "weight": 2.0},
                        ],
                        "correct_threshold": 1.5,
                    },
                },
            }
        }
        path = logs / "reward.yaml"
        path.write_text(yaml.safe_dump(config))
        reward = start_reward_server(logs, ["--config", str(path)])
        yield reward
    finally:
        if reward is not None:
            reward.proc.stop()
        stub.stop()
        engine.stop()


@pytest.fixture(scope="module")
def reference_scores(rm_dir: Path) -> dict[tuple[str, str], float]:
    """Each pair's raw score from its own unpadded forward pass in this process."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rm_dir)
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    out = {}
    with torch.inference_mode():
        for p, r in zip(PROMPTS, RESPONSES, strict=True):
            ids = torch.tensor([tok.encode(p + r)])
            out[(p, r)] = float(model(input_ids=ids).logits[0, 0])
    return out


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def metric(server: RewardServer, line_start: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_reward_model_scores_a_batch(servers: RewardServer, reference_scores: dict) -> None:
    items = [{"id": i, "kind": "model", "prompt": p, "response": r}
             for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True))]  # fmt: skip
    batches_before = metric(servers, 'dynamo_reward_model_batch_size_count{model="rm"}')
    results = servers.verify(*items)
    batches = metric(servers, 'dynamo_reward_model_batch_size_count{model="rm"}') - batches_before
    assert [res["id"] for res in results] == list(range(len(items)))
    raws = [res["raw_score"] for res in results]
    expected = [reference_scores[(p, r)] for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    assert raws == pytest.approx(expected, abs=1e-4)  # padded batches score as single pairs
    assert len({round(x, 3) for x in raws}) == len(raws)  # the model is not constant
    for res in results:
        assert res["score"] == pytest.approx(sigmoid(res["raw_score"]), abs=1e-9)
        assert res["reason"] == ("ok" if res["score"] >= 0.5 else "wrong_answer")
    assert batches == 2  # six pairs, batch_size 4: batched, not one pass per item


def test_routing_weights_and_gates(servers: RewardServer) -> None:
    p, r = PROMPTS[0], RESPONSES[0]
    right = {"kind": "math", "prompt": p, "ground_truth": "2", "data_source": "gsm"}
    results = servers.verify(
        {**right, "id": "right", "response": r + r"\boxed{2}", "response_length": 15},
        {**right, "id": "wrong", "response": r"Let's see: \boxed{3}"},
        {**right, "id": "elsewhere", "response": r"\boxed{2}", "data_source": "other"},
        {**right, "id": "no-source", "response": r"\boxed{3}", "data_source": None},
    )
    ok, wrong, elsewhere, plain = results
    # Correct: math 1, the model counts (its pair is prompt + the full response), length by
    # tokens (15 of max 20 with a buffer of 10: -0.5), no "Let's" prefix.
    assert set(ok["components"]) == {"math", "model", "model_raw", "length", "format"}
    c = ok["components"]
    assert c["math"] == 1.0 and c["length"] == -0.5 and c["format"] == 0.0
    assert c["model"] == pytest.approx(sigmoid(c["model_raw"]))
    assert ok["score"] == pytest.approx(1.0 + 0.5 * c["model"] - 0.5)
    assert ok["correct"] is True and ok["reason"] == "ok"
    # Wrong: the gated model never runs and scores 0; 20 chars -> length -1; "Let's" prefix.
    w = wrong["components"]
    assert w == {"math": 0.0, "model": 0.0, "length": -1.0, "format": 1.0}
    assert wrong["score"] == pytest.approx(-1.0 + 0.25)
    assert wrong["correct"] is False and wrong["reason"] == "wrong_answer"
    assert "model: gated off (math not correct)" in wrong["detail"]
    # No spec for the data source, or none given: the kind alone, the old response shape.
    assert elsewhere == {"id": "elsewhere", "score": 1.0, "correct": True, "format_ok": True,
                         "reason": "ok", "detail": "answer '2'", "answer": "2"}  # fmt: skip
    assert plain["score"] == 0.0 and "components" not in plain
    gated = 'dynamo_reward_components_total{component="model",data_source="gsm",outcome="gated"}'
    assert metric(servers, gated) >= 1
    hist = 'dynamo_reward_component_score_count{component="total",data_source="gsm"}'
    assert metric(servers, hist) >= 2


def test_judge_against_the_embedded_engine(servers: RewardServer, reference_scores: dict) -> None:
    p, r = PROMPTS[1], RESPONSES[1]
    judged = servers.one({"kind": "judge", "judge": "engine", "prompt": p, "response": r})
    assert judged["reason"] == "ok" and judged["raw_score"] == 7.0
    assert judged["score"] == pytest.approx(0.7)
    # Composite by data source: judge + 2 x reward model, correct from the total's threshold.
    res = servers.one({"kind": "judge", "data_source": "chat", "prompt": p, "response": r})
    c = res["components"]
    assert c["judge"] == pytest.approx(0.7)
    assert c["rm_raw"] == pytest.approx(reference_scores[(p, r)], abs=1e-4)
    total = 0.7 + 2 * sigmoid(reference_scores[(p, r)])
    assert res["score"] == pytest.approx(total, abs=1e-4)
    assert res["correct"] is (total >= 1.5)


def test_unparseable_judge_answer(servers: RewardServer) -> None:
    res = servers.one({"kind": "judge", "judge": "strict", "prompt": "q", "response": "a"})
    assert res["reason"] == "unparseable" and res["score"] == 0.0 and res["correct"] is False
    assert "'777'" in res["detail"] and "reward.judges.strict.score_pattern" in res["detail"]


def test_judge_that_times_out(servers: RewardServer) -> None:
    start = time.monotonic()
    res = servers.one({"kind": "judge", "judge": "slow", "prompt": "q", "response": "a"})
    took = time.monotonic() - start
    assert res["reason"] == "timeout" and res["score"] == 0.0
    assert "2/2 attempts" in res["detail"] and "reward.judges.slow.timeout_s" in res["detail"]
    assert 2.0 <= took < 15.0  # two 1-second attempts, not the server's 30 s
    assert (
        metric(servers, 'dynamo_reward_judge_requests_total{judge="slow",outcome="timeout"}') == 2
    )
    servers.assert_serving()


def test_chat_judge_is_retried_after_503(servers: RewardServer) -> None:
    res = servers.one({"kind": "judge", "judge": "flaky", "prompt": "q", "response": "a"})
    assert res["reason"] == "ok" and res["score"] == pytest.approx(0.9)


def test_component_needs_are_checked_before_scoring(servers: RewardServer) -> None:
    item: dict[str, Any] = {"id": 0, "kind": "judge", "prompt": "q", "response": "a",
                            "data_source": "gsm"}  # fmt: skip
    r = httpx.post(f"{servers.url}/v1/verify", json={"items": [item]}, timeout=30)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert [d["field"] for d in detail] == ["items.0.ground_truth"]
    assert "reward.composite.gsm.components.0" in detail[0]["msg"]
    r = httpx.post(f"{servers.url}/v1/verify", timeout=30,
                   json={"items": [{**item, "data_source": None, "judge": "nope"}]})  # fmt: skip
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "items.0.judge"
