"""The ``reasoning_gym`` kind at the service's edge: items it refuses (422 naming the field), and
scorers that hang or kill their worker (the pool's timeout: 0 with reason ``timeout``, never a
failed request). Every task's scores against the library's: ``tests/tasks/test_reasoning_gym.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import reasoning_gym

from dynamo_rl.config import load_config
from dynamo_rl.contracts.reward import MathItem, ReasoningGymItem
from dynamo_rl.contracts.rg_entry import encode_entry
from services.reward.composite import CompositeRouter
from services.reward.metrics import RewardMetrics
from tests.services.reward.conftest import RewardServer, start_reward_server


def _item(task: str, response: str, id_: str = "x", **extra: Any) -> dict[str, Any]:
    entry = reasoning_gym.create_dataset(task, size=1, seed=0)[0]
    return {"id": id_, "kind": "reasoning_gym", "data_source": f"reasoning_gym/{task}",
            "response": response, "entry": encode_entry(entry), **extra}  # fmt: skip


def test_an_unknown_task_or_a_malformed_entry_is_refused_naming_the_field(
    reward: RewardServer,
) -> None:
    tagged = {"question": "q", "answer": "a", "metadata": {"__tuple__": 3}}
    bad = [
        {**_item("chain_sum", "1"), "data_source": "reasoning_gym/chain_sums"},
        {**_item("chain_sum", "1"), "data_source": None},
        {**_item("chain_sum", "1"), "entry": {"question": "q", "answer": "a"}},
        {**_item("chain_sum", "1"), "entry": {"question": "q", "answer": 1, "metadata": {}}},
        {**_item("chain_sum", "1"), "entry": tagged},
    ]
    r = httpx.post(f"{reward.url}/v1/verify", json={"items": bad}, timeout=60)
    assert r.status_code == 422, r.text
    errors = {e["field"]: e["msg"] for e in r.json()["detail"]}
    assert set(errors) == {"items.0.data_source", "items.1.data_source", "items.2.entry",
                           "items.3.entry", "items.4.entry"}  # fmt: skip
    assert "'reasoning_gym/chain_sums' is not reasoning_gym/<task>, <task> one of " in errors[
        "items.0.data_source"]  # fmt: skip
    assert "missing metadata" in errors["items.2.entry"]
    assert "answer must be text or null" in errors["items.3.entry"]
    assert "entry.metadata.__tuple__: expected a list" in errors["items.4.entry"]


def test_a_scorer_that_hangs_or_kills_its_worker_scores_timeout_and_the_next_item_is_scored(
    tmp_path: Path,
) -> None:
    # polynomial_multiplication's scorer hands the answer to sympy.parse_expr, which computes
    # 9**9**9**9; string_insertion's evals the answer, here one that ends the worker process.
    server = start_reward_server(tmp_path, ["reward.code.enabled=false", "--math-workers", "1",
                                            "reward.reasoning_gym.workers=1",
                                            "reward.reasoning_gym.timeout_s=3"])  # fmt: skip
    try:
        results = server.verify(
            _item("polynomial_multiplication", "<answer>9**9**9**9</answer>", "hang"),
            _item("string_insertion", "<answer>__import__('os')._exit(3)</answer>", "exit"),
            _item("chain_sum", "<answer>nope</answer>", "after"),
            timeout=120,
        )
        assert [(r["id"], r["score"], r["reason"]) for r in results] == [
            ("hang", 0.0, "timeout"), ("exit", 0.0, "timeout"), ("after", 0.0, "wrong_answer")]  # fmt: skip
        assert "no answer within 3s" in results[0]["detail"]
        assert "worker died" in results[1]["detail"]
        right = reasoning_gym.create_dataset("chain_sum", size=1, seed=0)[0]["answer"]
        assert server.verify(_item("chain_sum", f"<answer>{right}</answer>"))[0]["score"] == 1.0
        server.assert_serving()
    finally:
        server.proc.stop()


def test_a_catch_all_composite_spec_leaves_reasoning_gym_items_to_their_kind() -> None:
    cfg = load_config(None, ["reward.composite.*.components=[{kind: math}]"], env={}).reward
    router = CompositeRouter(cfg, {}, RewardMetrics())
    assert router.route(ReasoningGymItem.model_validate(_item("chain_sum", "1"))) is None
    math = {"id": 1, "kind": "math", "response": "1", "ground_truth": "1", "data_source": "s"}
    assert router.route(MathItem.model_validate(math)) is not None
