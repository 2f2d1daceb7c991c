"""One multi-turn episode against the real vLLM server (CPU, tiny model), through the rollout
loop (``services.rollout.episodes.run_episode``) and the project's vLLM client: token ids in, token
ids and log-probs out, across turns.

The episode is ``guess_number`` with a secret the random model cannot guess, so it runs to
``max_turns`` and every observation is the environment's real feedback on what vLLM wrote. The
pool holds the server under two names (``127.0.0.1`` and ``localhost``: two replicas to the pool,
one process), so "the episode kept one engine" is a property of the loop, not of a one-replica
pool: without its preference the pool alternates between equally idle replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from dynamo_rl.codec import TrajectoryGroup, decode_group, encode_group
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts.reward import ItemResult
from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from dynamo_rl.envs import EnvContext, make_env
from learner.batch import batch_mask, samples_from_groups
from services.rollout.build import load_tokenizer
from services.rollout.engines import EnginePool, Sample
from services.rollout.engines.openai import OpenAICompletionsEngine
from services.rollout.episodes import Conversation, Episode, episode_responses, run_episode
from tests.vllm.conftest import VLLMServers
from tests.vllm.test_vllm_server import learner_logprobs, load_lm

pytestmark = pytest.mark.vllm

TURNS = 4
SAMPLING = Sampling(max_tokens=12, temperature=1.0, seed=7)
ROW = {"prompt": "", "ground_truth": "-123456789"}  # never the last integer of a 12-token turn


class RecordingPool(EnginePool):
    """The pool, keeping every sample it hands out (what vLLM sampled) and every prompt sent."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.sampled: list[Sample] = []
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_token_ids: Sequence[int], n: int, sampling: Sampling,
                       **kw: Any) -> list[Sample]:  # fmt: skip
        out = await super().generate(prompt_token_ids, n, sampling, **kw)
        self.prompts.append(list(prompt_token_ids))
        self.sampled += out
        return out


def play(url: str, conv: Conversation) -> tuple[Episode, RecordingPool]:
    alias = url.replace("127.0.0.1", "localhost")
    assert alias != url
    limits = EnvConfig(name="guess_number", max_turns=TURNS, max_episode_tokens=400)

    async def go() -> tuple[Episode, RecordingPool]:
        engines = [OpenAICompletionsEngine(u, weight_api="vllm", timeout_s=180.0)
                   for u in (url, alias)]  # fmt: skip
        pool = RecordingPool(engines)
        try:
            # A first request through the pool, so the episode does not start on replica 0 by
            # default (the pool's round-robin has moved on).
            await pool.generate([5, 6, 7], 1, Sampling(max_tokens=1, temperature=0.0))
            pool.sampled.clear()
            pool.prompts.clear()
            env = make_env(EnvContext(limits, None, seed=3))
            ep = await run_episode(pool, env, ROW, conv, SAMPLING, limits,
                                   seed_of=lambda t: 100 + t)  # fmt: skip
        finally:
            await pool.aclose()
        return ep, pool

    return asyncio.run(go())


def test_multi_turn_episode_on_vllm_token_in_token_out(vllm_servers: VLLMServers) -> None:
    """Plain template, 4 turns on vLLM: the sample holds vLLM's token ids (mask 1) and exactly the
    tokenised feedback (mask 0), and nothing else; each turn's prompt is the sample so far; the
    trained ids after the codec and the learner's batch are the sampled ones; vLLM's log-probs
    equal the learner's forward pass over the whole sample (the context vLLM saw is the one
    trained on); every turn went to one replica."""
    server = vllm_servers.get()  # raw_logprobs: the model's log-probs, at T=1 the sampling ones
    tok = load_tokenizer(str(server.model))
    conv = Conversation(tok, "plain")
    ep, pool = play(server.url, conv)

    # vLLM's own text of random bytes is not the tokenizer's decode (invalid UTF-8 is written
    # differently); the loop reads turns through the tokenizer, so the plain template extends.
    differ = sum(s.text != conv.model_text(s.token_ids) for s in pool.sampled)
    print(f"\nturns whose vLLM text differs from the tokenizer's decode: {differ} of {TURNS}")
    assert ep.model_texts == [conv.model_text(s.token_ids) for s in pool.sampled]
    assert ep.end_reason == "max_turns" and ep.forks == 0 and len(ep.segments) == 1
    assert len(pool.sampled) == TURNS and all(s.token_ids for s in pool.sampled)
    seg = ep.segments[0]
    assert seg.prompt_ids == tok.encode(
        "User: Guess my number between 1 and 100. Answer with one number.\nAssistant:"
    )

    # Every turn on one replica (either name), and the token ids went in as they were kept.
    assert len({s.engine_url for s in pool.sampled}) == 1, [s.engine_url for s in pool.sampled]
    for k, t in enumerate(seg.turns):
        assert pool.prompts[k] == seg.prompt_ids + seg.token_ids[: t.start]

    # Hand-checked layout: turn k's tokens as vLLM returned them (mask 1), then the environment's
    # feedback on turn k, tokenised as "\nUser: <feedback>\nAssistant:" (mask 0).
    replay = make_env(EnvContext(EnvConfig(name="guess_number"), None, seed=3))
    asyncio.run(replay.reset(ROW))
    expect_ids: list[int] = []
    expect_mask: list[int] = []
    for k, sample in enumerate(pool.sampled):
        t = seg.turns[k]
        assert seg.token_ids[t.start : t.end] == sample.token_ids
        assert seg.logprobs[t.start : t.end] == sample.logprobs
        expect_ids += sample.token_ids
        expect_mask += [1] * len(sample.token_ids)
        if k < TURNS - 1:
            [feedback] = asyncio.run(replay.step(conv.model_text(sample.token_ids))).observation
            obs = tok.encode(f"\nUser: {feedback['content']}\nAssistant:", add_special_tokens=False)
            assert seg.token_ids[t.end : t.observation_end] == obs
            expect_ids += obs
            expect_mask += [0] * len(obs)
    assert seg.token_ids == expect_ids
    assert seg.loss_mask == expect_mask
    assert set(seg.logprobs[i] for i, m in enumerate(seg.loss_mask) if not m) == {0.0}

    # Through the stream's codec and the learner's batch: trained ids = sampled ids.
    res = ItemResult(id="x", score=0.0, correct=False, format_ok=True, reason="wrong_answer")
    responses = episode_responses(ep, 0, res, seg.prompt_ids, EnvConfig(), conv)
    group = TrajectoryGroup(prompt_id="p", prompt_token_ids=seg.prompt_ids, responses=responses)
    [s] = samples_from_groups([decode_group(encode_group(group))], 0)
    trained = [t for t, m in zip(s.response, s.trained(), strict=True) if m]
    assert trained == [t for x in pool.sampled for t in x.token_ids]
    assert batch_mask([s])[0].tolist() == [float(m) for m in seg.loss_mask]

    # vLLM's log-prob of each model token = the learner's, computed over the whole sample (the
    # feedback tokens in context): what the engine was conditioned on is what is trained on.
    want = learner_logprobs(load_lm(server.model), seg.prompt_ids, seg.token_ids, 1.0)
    model_at = torch.tensor(seg.loss_mask, dtype=torch.bool)
    got = torch.tensor(seg.logprobs)
    gap = float((got[model_at] - want[model_at]).abs().max())
    assert gap < 1e-3, f"max |vLLM - learner| over the episode's model tokens = {gap:.2e}"
