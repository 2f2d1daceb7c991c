"""The judge's request bodies: a completions judge is an engine route, so its body is built by
the engine contract (``dynamo_rl.contracts.engine``) and carries exactly what the judge spec sets."""

from __future__ import annotations

import asyncio

from dynamo_rl.config.reward import JudgeSpec
from services.reward.judge_scorer import JudgeClient
from services.reward.metrics import RewardMetrics


def _request(**spec: object) -> tuple[str, dict]:
    client = JudgeClient("j", JudgeSpec(url="http://127.0.0.1:9", **spec), RewardMetrics())
    try:
        return client.request("What is 2+2?", "4", "4")
    finally:
        asyncio.run(client.close())


def test_a_completions_judge_sends_the_rendered_template_and_its_sampling_only() -> None:
    path, body = _request(api="completions", template="{prompt}|{response}|{reference}")
    assert path == "/v1/completions"
    assert body == {"prompt": "What is 2+2?|4|4", "max_tokens": 256, "temperature": 0.0}
    _, named = _request(api="completions", model="judge-1", max_tokens=8, temperature=0.5)
    assert named["model"] == "judge-1"
    assert (named["max_tokens"], named["temperature"]) == (8, 0.5)


def test_a_chat_judge_sends_messages() -> None:
    path, body = _request(system="be strict", template="{response}")
    assert path == "/v1/chat/completions"
    assert body == {
        "max_tokens": 256,
        "temperature": 0.0,
        "messages": [{"role": "system", "content": "be strict"}, {"role": "user", "content": "4"}],
    }
