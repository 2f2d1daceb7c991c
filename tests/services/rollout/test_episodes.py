"""Multi-turn episodes against a real embedded engine (tiny model, character tokenizer).

The tiny model writes random characters, so the environments here do not read its turns: their
observations are fixed, which makes every token of an episode checkable by hand.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dynamo_rl.codec import TrajectoryGroup, decode_group, encode_group
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts.reward import ItemResult
from dynamo_rl.contracts.sampling import SamplingParams as Sampling
from dynamo_rl.envs import (
    ENVIRONMENTS,
    EnvContext,
    Environment,
    EnvUnavailable,
    Step,
    ToolCallRecord,
    make_env,
)
from learner.batch import batch_mask, placed_turn_rewards, samples_from_groups
from services.rollout.build import load_tokenizer
from services.rollout.engines import EnginePool, Sample, make_engine
from services.rollout.episodes import Conversation, episode_responses, run_episode
from tests.conftest import REPO

SAMPLING = Sampling(max_tokens=6, temperature=1.0, seed=7)


class Fixed(Environment):
    """Observation ``obs <k>`` after turn k, reward k/10, a tool call per turn; done after
    ``turns`` turns. ``hang_at``: the step of that turn never returns; ``down_at``: the sandbox
    is down at that turn."""

    def __init__(self, turns: int = 3, hang_at: int = -1, down_at: int = -1) -> None:
        self.turns, self.hang_at, self.down_at, self.k = turns, hang_at, down_at, 0

    async def reset(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": str(row["prompt"])}]

    async def step(self, turn: str) -> Step:
        k, self.k = self.k, self.k + 1
        if k == self.hang_at:
            await asyncio.Event().wait()
        if k == self.down_at:
            raise EnvUnavailable("sandbox down")
        call = ToolCallRecord("probe", "{}", "", 0.0)
        return Step([{"role": "user", "content": f"obs {k}"}], k / 10, k + 1 >= self.turns,
                    {"tool_calls": [call]})  # fmt: skip


class RecordingPool(EnginePool):
    """The pool, keeping every sample it hands out (what the engine sampled)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.sampled: list[Sample] = []

    async def generate(self, prompt_token_ids: Sequence[int], n: int, sampling: Sampling,
                       **kw: Any) -> list[Sample]:  # fmt: skip
        out = await super().generate(prompt_token_ids, n, sampling, **kw)
        self.sampled += out
        return out


@pytest.fixture(scope="module")
def tokenizer(model: Path) -> Any:
    return load_tokenizer(str(model))


def limits(**kw: Any) -> EnvConfig:
    return EnvConfig(**{"max_turns": 8, "max_episode_tokens": 512, **kw})


def play(
    engine: str, env: Environment, conv: Conversation, lim: EnvConfig
) -> tuple[Any, RecordingPool]:
    async def go() -> tuple[Any, RecordingPool]:
        pool = RecordingPool([make_engine(engine)])
        try:
            ep = await run_episode(pool, env, {"prompt": "1+1="}, conv, SAMPLING, lim,
                                   seed_of=lambda t: 100 + t)  # fmt: skip
        finally:
            await pool.aclose()
        return ep, pool

    return asyncio.run(go())


def test_hand_checked_episode_mask_and_tokens(engine: str, tokenizer: Any) -> None:
    """Plain template: model tokens (mask 1) are the engine's, observation tokens (mask 0) are
    exactly ``\\nUser: obs k\\nAssistant:``; nothing else is in the sample."""
    conv = Conversation(tokenizer, "plain")
    ep, pool = play(engine, Fixed(turns=3), conv, limits())
    assert ep.end_reason == "done" and ep.forks == 0 and len(ep.segments) == 1
    seg = ep.segments[0]
    assert seg.prompt_ids == tokenizer.encode("User: 1+1=\nAssistant:")
    expect_ids: list[int] = []
    expect_mask: list[int] = []
    for k, sample in enumerate(pool.sampled):
        expect_ids += sample.token_ids
        expect_mask += [1] * len(sample.token_ids)
        if k < 2:  # the last turn ends the episode: no observation after it
            obs = tokenizer.encode(f"\nUser: obs {k}\nAssistant:", add_special_tokens=False)
            expect_ids += obs
            expect_mask += [0] * len(obs)
    assert len(pool.sampled) == 3
    assert seg.token_ids == expect_ids
    assert seg.loss_mask == expect_mask
    for t, sample in zip(seg.turns, pool.sampled, strict=True):
        assert seg.token_ids[t.start : t.end] == sample.token_ids
        assert seg.logprobs[t.start : t.end] == sample.logprobs
        assert set(seg.loss_mask[t.end : t.observation_end]) <= {0}


def test_trained_ids_equal_sampled_through_codec_and_learner(engine: str, tokenizer: Any) -> None:
    """The learner's sample (after encode/decode) holds the engine's ids at mask 1, and its
    training mask is 0 exactly at observation tokens."""
    conv = Conversation(tokenizer, "plain")
    ep, pool = play(engine, Fixed(turns=3), conv, limits())
    res = ItemResult(id="x", score=1.0, correct=True, format_ok=True, reason="ok")
    responses = episode_responses(ep, 0, res, ep.segments[0].prompt_ids, limits(), conv)
    group = TrajectoryGroup(prompt_id="p", prompt_token_ids=ep.segments[0].prompt_ids,
                            responses=responses)  # fmt: skip
    [s] = samples_from_groups([decode_group(encode_group(group))], 0)
    trained = [t for t, m in zip(s.response, s.trained(), strict=True) if m]
    assert trained == [t for x in pool.sampled for t in x.token_ids]
    mask = batch_mask([s])[0].tolist()
    assert mask == [float(m) for m in ep.segments[0].loss_mask]
    assert s.model_tokens == sum(len(x.token_ids) for x in pool.sampled)


FULL = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
# Earlier assistant turns are hidden, as templates that drop old <think> blocks do.
HIDING = (
    "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}"
    "<assistant>[...]</assistant>\n{% else %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.mark.parametrize("template,forks", [(FULL, 0), (HIDING, 2)])
def test_prefix_breaking_template_forks(
    engine: str, model: Path, template: str, forks: int
) -> None:
    tok = load_tokenizer(str(model))
    tok.chat_template = template
    conv = Conversation(tok, "chat")
    ep, pool = play(engine, Fixed(turns=3), conv, limits())
    assert ep.forks == forks and len(ep.segments) == forks + 1
    # Every model token is in exactly one sample, as sampled; a fork's prompt is the template's
    # rendering, tokenised whole.
    got = [s.token_ids[t.start : t.end] for s in ep.segments for t in s.turns]
    assert got == [x.token_ids for x in pool.sampled]
    if forks:
        messages = [{"role": "user", "content": "1+1="}]
        for k, x in enumerate(pool.sampled[:2]):
            messages += [{"role": "assistant", "content": x.text},
                         {"role": "user", "content": f"obs {k}"}]  # fmt: skip
            rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert ep.segments[k + 1].prompt_ids == tok.encode(rendered, add_special_tokens=False)
            assert ep.segments[k + 1].loss_mask == [1] * len(pool.sampled[k + 1].token_ids)


def test_max_turns_ends_episode(engine: str, tokenizer: Any) -> None:
    ep, pool = play(engine, Fixed(turns=99), Conversation(tokenizer, "plain"), limits(max_turns=2))
    assert ep.end_reason == "max_turns" and len(pool.sampled) == 2
    assert ep.segments[0].loss_mask[-1] == 1  # no observation after the last turn


def test_max_tool_calls_ends_episode(engine: str, tokenizer: Any) -> None:
    lim = limits(max_tool_calls=1)
    ep, pool = play(engine, Fixed(turns=99), Conversation(tokenizer, "plain"), lim)
    # Turn 0 makes call 1 (allowed, observed); turn 1 makes call 2 > 1: the episode ends.
    assert ep.end_reason == "max_tool_calls" and len(pool.sampled) == 2
    assert len(ep.tool_calls) == 2 and ep.segments[0].loss_mask[-1] == 1


def test_token_budget_ends_episode(engine: str, tokenizer: Any) -> None:
    conv = Conversation(tokenizer, "plain")
    budget = len(tokenizer.encode("User: 1+1=\nAssistant:")) + 20
    ep, _ = play(engine, Fixed(turns=99), conv, limits(max_episode_tokens=budget))
    assert ep.end_reason == "token_budget"
    assert ep.segments[0].context <= budget


def test_hung_tool_times_out_and_episode_goes_on(engine: str, tokenizer: Any) -> None:
    lim = limits(tool_timeout_s=0.5)
    ep, pool = play(engine, Fixed(turns=3, hang_at=1), Conversation(tokenizer, "plain"), lim)
    assert [c.error for c in ep.turns[1].tool_calls] == ["timeout"]
    # The hung step (turn 1) still counts as a step of the environment: done after turn 2.
    assert ep.end_reason == "done" and len(pool.sampled) == 3
    seg = ep.segments[0]
    t = seg.turns[1]
    obs = tokenizer.decode(seg.token_ids[t.end : t.observation_end])
    assert "timed out after 0.5s" in obs


def test_sandbox_outage_drops_episode(engine: str, tokenizer: Any) -> None:
    ep, _ = play(engine, Fixed(turns=3, down_at=1), Conversation(tokenizer, "plain"), limits())
    assert ep.dropped == "sandbox down"


def test_turn_rewards_land_on_each_turns_last_model_token(engine: str, tokenizer: Any) -> None:
    conv = Conversation(tokenizer, "plain")
    ep, _ = play(engine, Fixed(turns=3), conv, limits())
    lim = limits(turn_rewards=True, turn_reward_discount=0.5)
    res = ItemResult(id="x", score=1.0, correct=True, format_ok=True, reason="ok")
    [resp] = episode_responses(ep, 0, res, ep.segments[0].prompt_ids, lim, conv)
    # Turn rewards 0.0, 0.1, 0.2; turn k of 3 is discounted by 0.5^(2-k).
    placed = [0.0 * 0.25, 0.1 * 0.5, 0.2]
    assert [t.reward for t in resp.turns] == pytest.approx(placed)
    assert resp.reward == pytest.approx(1.0 + sum(placed))
    group = TrajectoryGroup(prompt_id="p", prompt_token_ids=ep.segments[0].prompt_ids,
                            responses=[resp])  # fmt: skip
    samples = samples_from_groups([decode_group(encode_group(group))], 0)
    tr = placed_turn_rewards(samples, batch_mask(samples))
    assert tr is not None
    want = [0.0] * len(resp.token_ids)
    for t, r in zip(resp.turns, placed, strict=True):
        want[t.end - 1] += r
    want[resp.turns[-1].end - 1] += 1.0  # the outcome, on the last model token
    assert tr[0].tolist() == pytest.approx(want)


def docs_example() -> str:
    text = (REPO / "docs" / "agents.md").read_text()
    [block] = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    return block


def test_the_docs_example_runs_as_written_and_plays_on_the_engine(
    engine: str, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert 25 <= len(docs_example().splitlines()) <= 60
    try:
        namespace: dict[str, Any] = {"__name__": "__main__"}
        exec(compile(docs_example(), "docs/agents.md", "exec"), namespace)
        assert capsys.readouterr().out == "total reward 3.0\n"
        env = make_env(EnvContext(EnvConfig(name="drill", max_turns=8), None, seed=1))
        ep, pool = play(engine, env, Conversation(tokenizer, "plain"), limits())
        assert ep.end_reason == "done" and len(pool.sampled) == 3
        assert [t.reward in (0.0, 1.0) for t in ep.turns] == [True] * 3
    finally:
        ENVIRONMENTS.pop("drill", None)


def test_segment_versions_are_written_only_for_a_response_that_spans_updates() -> None:
    from services.rollout.episodes import Segment

    seg = Segment([1, 2])
    seg.append([5, 6], [-1.0, -1.0], 1, [3, 3])
    assert seg.weight_versions() == []  # one version: the group's stands for it
    seg.append([7, 8], [0.0, 0.0], 0)  # an observation: the version of the tokens before it
    seg.append([9], [-1.0], 1, [4])
    assert seg.weight_versions() == [3, 3, 3, 3, 4]
    unknown = Segment([1])
    unknown.append([5, 6], [-1.0, -1.0], 1, [None, None])
    unknown.append([7], [-1.0], 1, [2])
    assert unknown.weight_versions() == []  # an engine that reported none: the group's
