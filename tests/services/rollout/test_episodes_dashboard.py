"""The dashboard's samples page on real multi-turn episodes (issue 24, item 8).

Episodes played against the real embedded engine (tiny model) go to a real Redis stream and to the
run folder's sample log exactly as the worker writes them; ``dynamo-rl dashboard`` serves them.
Each turn's model text, its tool calls (one that ran, one malformed), the observation after it and
the masked/unmasked token split must reach the API from both sources, and the page (headless
Chromium) must draw every turn. ``DYNAMO_SCREENSHOT_DIR`` takes the page's screenshot there.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from dashboard.sources import RunFolder, SampleFilter
from dynamo_rl.codec import Timing, TrajectoryGroup, encode_entry
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts.reward import ItemResult
from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from dynamo_rl.envs import Environment, Step, ToolCallRecord
from dynamo_rl.keys import trajectory_stream
from dynamo_rl.procs import http_ok
from dynamo_rl.sample_log import SampleLog
from services.rollout.build import load_tokenizer
from services.rollout.engines import EnginePool, make_engine
from services.rollout.episodes import Conversation, episode_responses, run_episode
from tests.conftest import dynamo_rl_argv
from tests.dashboard.test_dashboard_browser import CHROMIUM, body_attrs, chromium

NS = "episodes-dash"
pytestmark = pytest.mark.slow


class Probe(Environment):
    """Turn 0: a tool call that ran (output ``answer 0``); turn 1: a malformed call (an error
    observation); done after turn 2 with a turn reward each turn."""

    def __init__(self) -> None:
        self.k = 0

    async def reset(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": str(row["prompt"])}]

    async def step(self, turn: str) -> Step:
        k, self.k = self.k, self.k + 1
        if k == 1:
            call = ToolCallRecord("", "{not json", "malformed: expected JSON", 0.0, malformed=True)
            obs = "error: malformed tool call"
        else:
            call = ToolCallRecord("lookup", '{"q": 1}', "", 0.01)
            obs = f"answer {k}"
        return Step([{"role": "tool", "content": obs}], k / 10, k >= 2, {"tool_calls": [call]})


def play_group(engine: str, tokenizer: Any) -> TrajectoryGroup:
    conv = Conversation(tokenizer, "plain")
    env_cfg = EnvConfig(max_turns=8, max_episode_tokens=512, turn_rewards=True)
    res = ItemResult(id="x", score=1.0, correct=True, format_ok=True, reason="ok")

    async def go() -> TrajectoryGroup:
        pool = EnginePool([make_engine(engine)])
        sampling = Sampling(max_tokens=5, temperature=1.0, seed=3)
        try:
            episodes = []
            for j in range(2):
                seeds = lambda t, j=j: 10 * j + t  # noqa: E731
                row = {"prompt": "1+1="}
                ep = await run_episode(pool, Probe(), row, conv, sampling, env_cfg, seed_of=seeds)
                episodes.append(ep)
        finally:
            await pool.aclose()
        prompt = episodes[0].segments[0].prompt_ids
        responses = [r for j, e in enumerate(episodes)
                     for r in episode_responses(e, j, res, prompt, env_cfg, conv)]  # fmt: skip
        return TrajectoryGroup(
            prompt_id="ep-0", prompt_token_ids=prompt, responses=responses, namespace=NS,
            data_source="probe", prompt_text="User: 1+1=\nAssistant:", allocated_n=2,
            weight_version=0, worker_id="w0", batch_id="w0:x:0",
            timing=Timing(created_unix=1.7e9),
        )  # fmt: skip

    return asyncio.run(go())


def test_samples_page_shows_each_turn_tool_call_and_output(
    engine: str, model: Path, redis_url: str, service, free_port: int, tmp_path: Path
) -> None:
    tokenizer = load_tokenizer(str(model))
    group = play_group(engine, tokenizer)
    decode = Conversation(tokenizer, "plain").decode  # the worker's own decoding
    assert [len(r.turns) for r in group.responses] == [3, 3]
    client = redis.Redis.from_url(redis_url)
    client.xadd(trajectory_stream(NS), encode_entry(group))
    client.close()
    run = tmp_path / "run"
    SampleLog.in_run(run, "w0", 1).write([group])

    base = f"http://127.0.0.1:{free_port}"
    argv = dynamo_rl_argv("dashboard", "--port", str(free_port), f"endpoints.redis_url={redis_url}",
                          f"run.name={NS}", f"run.dir={run}")  # fmt: skip
    service("dashboard", argv, http_ok(base + "/healthz"), timeout=60)
    live = httpx.get(base + "/api/samples?limit=10", timeout=30).json()
    assert live["origin"] == "redis"
    after = RunFolder(run).read(SampleFilter())  # the sample log, as after the run
    for rows in (live["rows"], after["rows"]):
        assert len(rows) == 2
        for row, r in zip(rows, group.responses, strict=True):
            ids, mask = list(r.token_ids), list(r.loss_mask)
            assert (row["model_tokens"], row["masked_tokens"]) == (sum(mask), mask.count(0))
            assert row["end_reason"] == "done" and row["episode"] == r.episode
            for k, (turn, t) in enumerate(zip(row["turns"], r.turns, strict=True)):
                # The turn's text is the sampled tokens decoded; the observation, the masked
                # tokens after them (the tool output as the model saw it).
                assert turn["text"] == decode(ids[t.start : t.end])
                assert turn["model_tokens"] == t.end - t.start == sum(mask[t.start : t.end])
                assert turn["observation"] == decode(ids[t.end : t.observation_end])
                assert turn["observation_tokens"] == mask[t.end : t.observation_end].count(0)
                assert turn["reward"] == pytest.approx(k / 10)  # turn_reward_discount 1
                [call] = turn["tool_calls"]
                if k == 1:
                    assert call["malformed"] and call["error"].startswith("malformed")
                    assert "error: malformed tool call" in turn["observation"]
                else:
                    assert (call["name"], call["arguments"], call["error"]) == (
                        "lookup", '{"q": 1}', "")  # fmt: skip
                if k == 0:
                    assert "answer 0" in turn["observation"]
            assert row["turns"][-1]["observation_tokens"] == 0  # done: no observation after it

    if CHROMIUM is None:
        pytest.skip("the page check needs Debian's chromium (scripts/setup.sh)")
    dom = chromium(tmp_path, "--dump-dom", base + "/samples?limit=10")
    attrs = body_attrs(dom)
    assert attrs.get("data-ready") == "true" and attrs["data-rows"] == "2", attrs
    assert attrs["data-turns"] == "6"
    assert len(re.findall(r'class="turn model"', dom)) == 6
    assert dom.count("tool call lookup(") == 4 and "error: malformed" in dom
    assert len(re.findall(r'class="turn obs"', dom)) == 4  # the last turn of each has none
    assert "answer 0" in dom and "observation tokens (masked)" in dom
    if os.environ.get("DYNAMO_SCREENSHOT_DIR"):  # docs/img/dashboard-episode.png
        out = Path(os.environ["DYNAMO_SCREENSHOT_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        chromium(tmp_path, f"--screenshot={out / 'dashboard-episode.png'}",
                 "--window-size=1400,760", base + "/samples?limit=1")  # fmt: skip
