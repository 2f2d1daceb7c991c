"""verifiers environments (``services/rollout/verifiers_env.py``) played against a real embedded
engine over HTTP: a single-turn and a multi-turn environment written in the library's own API
(``vf_envs/``), their rubrics, the drops, and the stream path (codec and Redis).

What the engine sampled is read from the HTTP answers themselves (an ``httpx`` hook on the
client), so the check that the trained ids are the sampled ids does not go through the code
under test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from dynamo_rl.codec import TrajectoryGroup, decode_entry, encode_entry, validate_group
from learner.tiny_model import build_tiny_model
from services.rollout.verifiers_env import (
    VERIFIERS_VERSION,
    Drops,
    EpisodeDropped,
    VerifiersConfigError,
    VerifiersEpisode,
    assemble_segments,
    chat_client,
    load_verifiers_env,
    play_verifiers_episode,
    play_verifiers_group,
    sampling_args,
    verifiers_rows,
)
from tests.services.engine.engine_util import CHAT_TEMPLATE, running_engine

ENVS = Path(__file__).parent / "vf_envs"
SINGLE = str(ENVS / "vf_single.py")
MULTI = str(ENVS / "vf_multi.py")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = build_tiny_model(
        tmp_path_factory.mktemp("vf") / "m", hidden_size=32, num_layers=2, num_heads=2,
        num_kv_heads=1, max_positions=512, chat_template=CHAT_TEMPLATE,
    )  # fmt: skip
    with running_engine(model, tmp_path_factory.mktemp("engine")) as u:
        yield u


class Recorded:
    """verifiers' own chat client on the engine, keeping every chat answer as it came."""

    def __init__(self, url: str) -> None:
        from openai import AsyncOpenAI
        from verifiers.clients import OpenAIChatCompletionsClient

        self.answers: list[dict[str, Any]] = []
        self.asked: list[dict[str, Any]] = []

        async def keep(response: httpx.Response) -> None:
            if response.url.path.endswith("/chat/completions"):
                await response.aread()
                self.answers.append(json.loads(response.content))
                self.asked.append(json.loads(response.request.content))

        http = httpx.AsyncClient(event_hooks={"response": [keep]})
        self.client = OpenAIChatCompletionsClient(
            AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, http_client=http)
        )

    def turns(self) -> list[tuple[list[int], list[int], list[float], str]]:
        """Each answer's prompt ids, sampled ids, their log-probs and text."""
        out = []
        for a in self.answers:
            c = a["choices"][0]
            lps = [e["logprob"] for e in c["logprobs"]["content"]]
            out.append((a["prompt_token_ids"], c["token_ids"], lps, c["message"]["content"]))
        return out


def play(
    url: str, module: str, sampling: dict[str, Any] | None = None, **args: Any
) -> tuple[VerifiersEpisode, Recorded]:
    env = load_verifiers_env(module, args)
    rec = Recorded(url)
    sampling = sampling or sampling_args(max_tokens=6, temperature=1.0)
    ep = asyncio.run(play_verifiers_episode(env, verifiers_rows(env)[0], rec.client, "m", sampling))
    return ep, rec


def check_trains_what_was_sampled(ep: VerifiersEpisode, rec: Recorded) -> None:
    """Every model turn's ids and log-probs are the engine's, in order, with mask 1 exactly on
    them; a segment starts at its first turn's prompt; what lies between two turns of a segment
    is the engine's next prompt, mask 0."""
    sampled = rec.turns()
    k = 0
    for seg in ep.segments:
        assert seg.prompt_ids == sampled[k][0]
        model = [0] * len(seg.token_ids)
        for t in seg.turns:
            _, ids, lps, _ = sampled[k]
            assert seg.token_ids[t.start : t.end] == ids
            assert seg.logprobs[t.start : t.end] == pytest.approx(lps)
            model[t.start : t.end] = [1] * len(ids)
            if t.observation_end > t.end:  # the next turn's prompt holds the tokens between
                assert seg.prompt_ids + seg.token_ids[: t.observation_end] == sampled[k + 1][0]
            k += 1
        assert seg.loss_mask == model
    assert k == len(sampled)


def test_single_turn_episode_trains_the_sampled_ids_and_its_rubric_scores_them(url: str) -> None:
    import verifiers

    assert verifiers.__version__ == VERIFIERS_VERSION
    ep, rec = play(url, SINGLE)
    assert len(rec.answers) == 1 and ep.forks == 0
    check_trains_what_was_sampled(ep, rec)
    (seg,) = ep.segments
    assert seg.loss_mask == [1] * len(seg.token_ids) and len(seg.token_ids) > 0
    # The rubric scored the engine's text: its reward function is that text's length.
    assert ep.text == rec.turns()[0][3]
    assert ep.reward == float(len(ep.text)) == ep.metrics["text_length"]


def test_multi_turn_episode_trains_each_sampled_turn_and_masks_the_rest(url: str) -> None:
    ep, rec = play(url, MULTI, max_turns=3)
    assert len(rec.answers) == 3
    check_trains_what_was_sampled(ep, rec)
    assert sum(len(s.turns) for s in ep.segments) == 3
    assert ep.reward == 3.0  # the rubric counts the turns
    # Turns 2 and 3 were asked with the model's text, then the environment's message.
    for k in (1, 2):
        *_, model, env = rec.asked[k]["messages"]
        assert (model["role"], model["content"]) == ("assistant", rec.turns()[k - 1][3])
        assert (env["role"], env["content"]) == ("user", f"Turn {k} seen. Again?")


def test_a_turn_that_extends_the_episode_keeps_one_sample_with_the_env_tokens_masked(
    url: str,
) -> None:
    """The tiny model's byte tokenizer re-reads most sampled bytes differently (a fork); a seeded
    one-token turn that is plain ASCII is read back as sampled, so the next prompt extends it."""
    for seed in range(60):
        ep, rec = play(url, MULTI, sampling_args(max_tokens=1, seed=seed), max_turns=2)
        if ep.forks == 0:
            break
    else:
        pytest.fail("no seed gave a turn the engine read back as sampled")
    check_trains_what_was_sampled(ep, rec)
    (seg,) = ep.segments
    first, second = seg.turns
    assert (first.start, first.end) == (0, 1) and second.start > first.end
    assert first.observation_end == second.start
    assert seg.loss_mask == [1] + [0] * (second.start - 1) + [1]
    assert seg.logprobs[1 : second.start] == [0.0] * (second.start - 1)


async def play_each(
    env: Any, row: dict[str, Any], rec: Recorded, samplings: list[dict[str, Any]], drops: Drops
) -> list[VerifiersEpisode]:
    """One episode of ``row`` with each sampling, in order, on one client."""
    groups = [await play_verifiers_group(env, row, rec.client, "m", s, 1, drops) for s in samplings]
    return [e for g in groups for e in g]


def test_episodes_go_on_the_stream_and_come_back_whole(url: str, redis_url: str) -> None:
    """A group with a forked episode and one that kept its environment's tokens (mask 0)."""
    env = load_verifiers_env(MULTI, {"max_turns": 2})
    row = verifiers_rows(env)[1]
    for seed in range(60):
        drops = Drops()
        rec = Recorded(url)
        sampling = [sampling_args(max_tokens=3), sampling_args(max_tokens=1, seed=seed)]

        eps = asyncio.run(play_each(env, row, rec, sampling, drops))
        if eps[0].forks and not eps[1].forks:
            break
    else:
        pytest.fail("no seed gave a group with a forked and an unforked episode")
    assert len(eps) == 2 and drops.total == 0
    assert drops.forks == sum(e.forks for e in eps)
    group_prompt = eps[0].segments[0].prompt_ids
    responses = [r for i, e in enumerate(eps) for r in e.responses(group_prompt, episode=i)]
    group = validate_group(
        TrajectoryGroup(prompt_id="vf-1", prompt_token_ids=group_prompt, responses=responses)
    )
    client = redis.Redis.from_url(redis_url)
    client.xadd("vf:stream", encode_entry(group))
    ((_, fields),) = client.xrange("vf:stream")
    back = decode_entry(fields)
    assert back == group
    sampled = {tuple(ids) for _, ids, _, _ in rec.turns()}
    for r in back.responses:
        for t in r.turns:
            assert tuple(r.token_ids[t.start : t.end]) in sampled
        mask = [0] * len(r.token_ids)
        for t in r.turns:
            mask[t.start : t.end] = [1] * (t.end - t.start)
        assert list(r.loss_mask) == mask


@pytest.mark.parametrize(
    ("module", "args", "reason", "field"),
    [
        (MULTI, {"fail_at": 1}, "env_error", "env.rollout"),
        (SINGLE, {"reward": "none"}, "rubric_error", "env.rubric"),
        (SINGLE, {"reward": "raise"}, "rubric_error", "env.rubric"),
    ],
)
def test_a_failing_environment_or_rubric_drops_its_episode_and_counts_it(
    url: str, module: str, args: dict[str, Any], reason: str, field: str
) -> None:
    env = load_verifiers_env(module, args)
    drops = Drops()
    rec = Recorded(url)
    kept = asyncio.run(
        play_verifiers_group(
            env, verifiers_rows(env)[0], rec.client, "m", sampling_args(max_tokens=4), 2, drops
        )
    )
    assert kept == [] and drops.counts == {reason: 2}
    with pytest.raises(EpisodeDropped) as e:
        asyncio.run(
            play_verifiers_episode(
                env, verifiers_rows(env)[0], Recorded(url).client, "m", sampling_args(4)
            )
        )
    assert e.value.reason == reason and e.value.field == field


def test_env_tokens_between_turns_get_mask_zero_and_a_changed_prompt_forks() -> None:
    def step(prompt: list[int], ids: list[int]) -> dict[str, Any]:
        lps = [-0.5] * len(ids)
        return {"tokens": {"prompt_ids": prompt, "completion_ids": ids, "completion_logprobs": lps}}

    segs = assemble_segments([step([1, 2], [3, 4]), step([1, 2, 3, 4, 5, 6], [7])])
    (seg,) = segs
    assert seg.prompt_ids == [1, 2] and seg.token_ids == [3, 4, 5, 6, 7]
    assert seg.loss_mask == [1, 1, 0, 0, 1]
    assert seg.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert [(t.start, t.end, t.observation_end) for t in seg.turns] == [(0, 2, 4), (4, 5, 5)]
    # The engine's next prompt does not extend the tokens kept (3 re-read as 9): a new sample.
    a, b = assemble_segments([step([1, 2], [3, 4]), step([1, 2, 9, 4, 5], [7])])
    assert (a.token_ids, a.loss_mask) == ([3, 4], [1, 1])
    assert (b.prompt_ids, b.token_ids, b.loss_mask) == ([1, 2, 9, 4, 5], [7], [1])
    with pytest.raises(EpisodeDropped) as e:
        assemble_segments([step([1], [2]), {"tokens": None}])
    assert (e.value.reason, e.value.field) == ("no_token_ids", "state.trajectory.1.tokens")


def test_loading_errors_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(VerifiersConfigError, match=r"^module: no file"):
        load_verifiers_env(str(tmp_path / "missing.py"))
    bare = tmp_path / "bare.py"
    bare.write_text("x = 1\n")
    with pytest.raises(VerifiersConfigError, match=r"^module: .* has no load_environment"):
        load_verifiers_env(str(bare))
    with pytest.raises(VerifiersConfigError, match=r"^module: cannot import"):
        load_verifiers_env("no_such_verifiers_environment_pkg")
    with pytest.raises(VerifiersConfigError, match=r"^args: load_environment"):
        load_verifiers_env(SINGLE, {"no_such_arg": 1})
    odd = tmp_path / "odd.py"
    odd.write_text("def load_environment():\n    return 3\n")
    with pytest.raises(
        VerifiersConfigError, match=r"^module: load_environment\(\) returned int, not a verifiers"
    ):
        load_verifiers_env(str(odd))


def test_an_error_the_protocol_records_drops_the_episode(free_port: int) -> None:
    env = load_verifiers_env(SINGLE)
    down = chat_client(f"http://127.0.0.1:{free_port}")  # nothing listens there
    with pytest.raises(EpisodeDropped) as e:
        asyncio.run(
            play_verifiers_episode(env, verifiers_rows(env)[0], down, "m", sampling_args(4))
        )
    assert (e.value.reason, e.value.field) == ("env_error", "state.error")
