"""Episodes, token in and token out (``rollout.env``; ``docs/agents.md``): every rollout is one.

One episode (:func:`open_episode`, then :func:`play_episode`; :func:`run_episode` does both):

1. ``env.reset(row)`` gives the first messages; they are rendered like a dataset prompt
   (:class:`Conversation`). An environment of the single-turn shape (``multi_turn = False``, see
   :mod:`dynamo_rl.envs.base`) starts from the row's prompt as the dataset rendered it instead
   (``rendered``: a text prompt verbatim, cut by the length policy);
2. the engine samples a turn from the token ids kept so far; its token ids and log-probs are
   appended as they came (loss mask 1) — model output is never re-tokenised. The first turn may
   come in sampled already (the pipeline samples a group's first turns together);
3. ``env.step(text)`` (under ``tool_timeout_s``; ``text`` is the turn's ids decoded by the
   worker's tokenizer, not the engine's text) gives observation messages. The whole
   conversation is rendered again; when that text extends the text of the tokens kept so far,
   only the new part (the observation and the template's markers around it) is tokenised and
   appended with loss mask 0. When it does not — a chat template that drops earlier ``<think>``
   blocks, say — the sample so far is closed and a new one starts from the new rendering (a
   **fork**, counted), never re-tokenising what the model sampled;
4. until the environment says done or a limit ends it: ``max_turns``, ``max_tool_calls``,
   ``max_episode_tokens`` (the context: a segment's prompt + response tokens; None: no budget),
   or a turn cut at ``max_tokens`` by the budget.

:func:`episode_responses` turns a scored episode into the stream's responses: one per segment,
with loss mask and turns; one plain response (the engine's sample) in the single-turn shape.

A hung step becomes a ``tool`` error message (the episode goes on); a sandbox that stays down
(:class:`~dynamo_rl.envs.EnvUnavailable`) drops the episode. An episode keeps one engine while it
is healthy (prefix-cache reuse). Episodes of a batch, and so their tool calls, run concurrently.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynamo_rl.codec import Response, ToolCall, Turn
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.contracts.reward import ItemResult
from dynamo_rl.contracts.sampling import SamplingParams
from dynamo_rl.envs import Environment, EnvUnavailable, Message, Step, ToolCallRecord
from dynamo_rl.prompts import render_plain, render_raw, uses_chat_template
from services.rollout.datasets import PromptRecord
from services.rollout.engines import EnginePool, Sample

__all__ = [
    "Conversation",
    "Episode",
    "Opening",
    "Segment",
    "TurnRecord",
    "episode_responses",
    "open_episode",
    "play_episode",
    "record_row",
    "render_conversation",
    "run_episode",
    "turn_sampling",
]

END_REASONS = ("done", "max_turns", "max_tool_calls", "token_budget")


def render_conversation(
    tokenizer: Any, messages: Sequence[Mapping[str, str]], template: str
) -> str:
    """The text of a conversation, ending in the generation prompt unless the last message is
    the assistant's. Without assistant messages it is the single-turn prompt text
    (:func:`dynamo_rl.prompts.render_prompt`); an assistant message is written exactly where
    generation continued (``Assistant:`` + its text in the plain template, its text right after
    the previous message in the raw one), so a model turn extends the text it was sampled from."""
    msgs = list(messages)
    last_is_model = bool(msgs) and msgs[-1]["role"] == "assistant"
    if template != "raw" and uses_chat_template(tokenizer, template):
        return str(
            tokenizer.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=not last_is_model
            )
        )
    if template == "raw":
        return render_raw(msgs)
    parts: list[str] = []
    for m in msgs:
        if m["role"] == "assistant":
            parts.append("Assistant:" + m["content"])
        else:
            parts.append(render_plain([m]).removesuffix("\nAssistant:"))
    return "\n".join(parts) + ("" if last_is_model else "\nAssistant:")


class Conversation:
    """Renders conversations to text and tokens with the worker's tokenizer and template."""

    def __init__(self, tokenizer: Any, template: str) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.chat = template != "raw" and uses_chat_template(tokenizer, template)

    def text(self, messages: Sequence[Mapping[str, str]]) -> str:
        return render_conversation(self.tokenizer, messages, self.template)

    def prompt_ids(self, text: str) -> list[int]:
        """A whole prompt's ids, as :func:`dynamo_rl.prompts.render_prompt` encodes it."""
        return list(self.tokenizer.encode(text, add_special_tokens=not self.chat))

    def piece_ids(self, text: str) -> list[int]:
        """Ids of text appended to a conversation (no special tokens added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def model_text(self, ids: Sequence[int]) -> str:
        """A model turn's text as this tokenizer reads its ids (special tokens skipped): what the
        conversation, the environment and the outcome reward see. Not the engine's text: vLLM's
        incremental detokenizer writes bytes that are not valid UTF-8 differently from a whole
        decode, and the conversation must extend the decoded tokens kept (rule 3) whoever
        served the turn."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        # A chat template writes the turn's end token itself; the plain and raw templates do not,
        # so there the model's end-of-text token is not part of the conversation's text.
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=not self.chat))


def record_row(record: PromptRecord) -> dict[str, Any]:
    """The row an environment's ``reset`` sees."""
    return {
        **record.reward_extra,
        "prompt_id": record.prompt_id,
        "prompt": record.prompt,
        "ground_truth": record.ground_truth,
        "data_source": record.data_source,
        "kind": record.kind,
    }


@dataclass
class TurnRecord:
    start: int
    end: int
    observation_end: int
    weight_version: int | None = None
    """The weight version the engine reported for the turn (None: it reported none)."""
    text: str = ""
    """The turn's text as the engine returned it."""
    finish_reason: str = "stop"
    """The engine's finish reason for the turn."""
    reward: float | None = None
    """The environment's reward for the turn (before discount)."""
    tool_calls: list[ToolCallRecord] = field(default_factory=list)


@dataclass
class Segment:
    """One training sample of an episode: a prompt and the response that continues it."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    versions: list[int | None] = field(default_factory=list)
    """The weight version of each token (an observation's: the model tokens' before it)."""

    @property
    def context(self) -> int:
        return len(self.prompt_ids) + len(self.token_ids)

    def append(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float],
        trained: int,
        versions: Sequence[int | None] | None = None,
    ) -> None:
        self.token_ids += list(ids)
        self.logprobs += list(logprobs)
        self.loss_mask += [trained] * len(ids)
        if versions is None:
            versions = [self.versions[-1] if self.versions else None] * len(ids)
        self.versions += list(versions)

    def weight_versions(self) -> list[int]:
        """Every token's version for the stream when they differ (the response spans an update);
        empty when they are all one version or an engine reported none: the group's version, the
        oldest of the group's, stands for them (as before per-token versions)."""
        if None in self.versions or len(set(self.versions)) < 2:
            return []
        return list(self.versions)  # type: ignore[arg-type]


@dataclass
class Episode:
    segments: list[Segment]
    model_texts: list[str] = field(default_factory=list)
    end_reason: str = ""
    forks: int = 0
    dropped: str | None = None
    """Why the episode was dropped (the sandbox stayed down); None when it was not."""
    multi_turn: bool = True
    """The environment's ``multi_turn``: False, the single-turn shape."""

    @property
    def final_text(self) -> str:
        """What the outcome reward scores: the last model turn's text as the worker's tokenizer
        reads it; in the single-turn shape, the engine's text (as single-turn rollouts always
        were scored)."""
        if not self.multi_turn:
            return self.turns[-1].text if self.turns else ""
        return self.model_texts[-1] if self.model_texts else ""

    @property
    def transcript(self) -> str:
        """The model's turns in one line (``" | "`` between turns), as eval's sample log keeps it."""
        return " | ".join(self.model_texts) if self.multi_turn else self.final_text

    @property
    def turns(self) -> list[TurnRecord]:
        return [t for s in self.segments for t in s.turns]

    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        return [c for t in self.turns for c in t.tool_calls]

    @property
    def model_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.segments)

    @property
    def observation_tokens(self) -> int:
        return sum(len(s.loss_mask) - sum(s.loss_mask) for s in self.segments)


def _timeout_step(seconds: float) -> Step:
    return Step(
        [{"role": "tool", "content": f"error: the tool timed out after {seconds:g}s"}],
        None,
        False,
        {"tool_calls": [ToolCallRecord("", "", "timeout", seconds)]},
    )


def turn_sampling(
    sampling: SamplingParams, limits: EnvConfig, context: int, seed: int | None
) -> SamplingParams | None:
    """A turn's request parameters: ``max_tokens`` cut to the room the budget leaves a sample of
    ``context`` tokens so far; None when it leaves none."""
    if limits.max_episode_tokens is None:
        return dataclasses.replace(sampling, seed=seed)
    room = limits.max_episode_tokens - context
    if room < 1:
        return None
    return dataclasses.replace(sampling, max_tokens=min(sampling.max_tokens, room), seed=seed)


def _over_budget(limits: EnvConfig, tokens: int) -> bool:
    return limits.max_episode_tokens is not None and tokens >= limits.max_episode_tokens


@dataclass
class Opening:
    """An episode before its first turn: the messages so far and the first prompt."""

    messages: list[Message]
    text: str
    prompt_ids: list[int]


async def open_episode(
    env: Environment,
    row: Mapping[str, Any],
    conversation: Conversation,
    rendered: tuple[str, list[int]] | None = None,
) -> Opening:
    """``env.reset(row)`` and the first prompt (step 1 of the module docstring); ``rendered`` is
    the row's prompt as the dataset rendered it (used in the single-turn shape)."""
    messages = list(await env.reset(row))
    if not env.multi_turn and rendered is not None:
        text, ids = rendered
        return Opening(messages, text, list(ids))
    text = conversation.text(messages)
    return Opening(messages, text, conversation.prompt_ids(text))


async def run_episode(
    pool: EnginePool,
    env: Environment,
    row: Mapping[str, Any],
    conversation: Conversation,
    sampling: SamplingParams,
    limits: EnvConfig,
    *,
    seed_of: Callable[[int], int | None] = lambda _turn: None,
    rendered: tuple[str, list[int]] | None = None,
) -> Episode:
    """Play one episode (see the module docstring); ``limits`` is ``rollout.env``, turn ``k``
    sampled with seed ``seed_of(k)``.

    Raises :class:`~services.rollout.engines.EngineRequestError` when an engine refuses the
    first prompt (the caller dead-letters it)."""
    opening = await open_episode(env, row, conversation, rendered)
    return await play_episode(pool, env, opening, conversation, sampling, limits, seed_of=seed_of)


async def play_episode(
    pool: EnginePool,
    env: Environment,
    opening: Opening,
    conversation: Conversation,
    sampling: SamplingParams,
    limits: EnvConfig,
    *,
    seed_of: Callable[[int], int | None] = lambda _turn: None,
    first: Sample | None = None,
) -> Episode:
    """Play an opened episode from its first turn on; ``first``: that turn, sampled already
    (with the parameters :func:`turn_sampling` gives it)."""
    messages = list(opening.messages)
    kept = opening.text
    seg = Segment(list(opening.prompt_ids))
    episode = Episode([seg], multi_turn=env.multi_turn)
    engine_url: str | None = None
    calls = 0
    for turn_index in range(limits.max_turns):
        s = turn_sampling(sampling, limits, seg.context, seed_of(turn_index))
        if s is None:
            episode.end_reason = "token_budget"
            break
        if turn_index == 0 and first is not None:
            sample = first
        else:
            prompt = seg.prompt_ids + seg.token_ids
            [sample] = await pool.generate(prompt, 1, s, prefer=engine_url)
        engine_url = sample.engine_url or engine_url
        turn = TurnRecord(len(seg.token_ids), 0, 0, sample.weight_version, sample.text,
                          sample.finish_reason)  # fmt: skip
        seg.append(sample.token_ids, sample.logprobs, 1, sample.token_versions())
        turn.end = turn.observation_end = len(seg.token_ids)
        seg.turns.append(turn)
        said = conversation.model_text(sample.token_ids)
        episode.model_texts.append(said)
        kept += conversation.decode(sample.token_ids)
        messages.append({"role": "assistant", "content": said})
        if sample.finish_reason == "length" and s.max_tokens < sampling.max_tokens:
            episode.end_reason = "token_budget"  # cut by the budget, not by max_tokens
            break
        try:
            step = await asyncio.wait_for(env.step(said), limits.tool_timeout_s)
        except TimeoutError:
            step = _timeout_step(limits.tool_timeout_s)
        except EnvUnavailable as e:
            episode.dropped = str(e)
            return episode
        obs, reward, done, info = step
        turn.reward = reward
        turn.tool_calls = list((info or {}).get("tool_calls", []))
        calls += len(turn.tool_calls)
        if done:
            episode.end_reason = "done"
            break
        if calls > limits.max_tool_calls:
            episode.end_reason = "max_tool_calls"
            break
        if turn_index + 1 == limits.max_turns:
            episode.end_reason = "max_turns"
            break
        messages += obs
        text = conversation.text(messages)
        if text.startswith(kept):
            ids = conversation.piece_ids(text[len(kept) :])
            if _over_budget(limits, seg.context + len(ids)):
                episode.end_reason = "token_budget"
                break
            seg.append(ids, [0.0] * len(ids), 0)
            turn.observation_end = len(seg.token_ids)
        else:  # the template rewrote what came before: a new sample continues the episode
            ids = conversation.prompt_ids(text)
            if _over_budget(limits, len(ids)):
                episode.end_reason = "token_budget"
                break
            seg = Segment(ids)
            episode.segments.append(seg)
            episode.forks += 1
        kept = text
    return episode


def episode_responses(
    episode: Episode,
    index: int,
    res: ItemResult,
    group_prompt: list[int],
    env_cfg: EnvConfig,
    conversation: Conversation,
) -> list[Response]:
    """The training samples of one episode scored ``res``: one per segment; in the single-turn
    shape one plain response, the engine's sample as it came (no loss mask, turns or episode
    fields: a single-turn trajectory as the stream always carried it).

    A segment is credited with what follows its first token: the outcome, plus the per-turn
    rewards after discount (``rollout.env.turn_rewards``: turn ``k`` of ``K`` counts
    ``turn_reward_discount^(K-1-k)``, placed on its last model token) of its own turns and the
    later segments' turns, minus ``malformed_penalty`` per malformed call and ``tool_call_cost``
    per call in those turns (``correct`` stays the outcome's); the
    first segment (and an episode that did not fork) so gets the episode's return. Each segment's
    ``finish_reason`` is its last turn's. ``prompt_token_ids`` is set only where a segment's
    prompt is not the group's (a fork)."""
    turns = episode.turns
    k_last = len(turns) - 1
    placed: dict[int, float] = {}
    if env_cfg.turn_rewards:
        for k, t in enumerate(turns):
            if t.reward is not None:
                placed[id(t)] = t.reward * env_cfg.turn_reward_discount ** (k_last - k)
    components = {str(a): float(b) for a, b in (res.components or {}).items()}

    def credit(first: int) -> float:
        """The reward of segment ``first``: the outcome and its own and later turns' rewards."""
        later = [t for s in episode.segments[first:] for t in s.turns]
        malformed = sum(c.malformed for t in later for c in t.tool_calls)
        calls = sum(len(t.tool_calls) for t in later)
        turn_rewards = sum(placed[id(t)] for t in later if id(t) in placed)
        return (res.score + turn_rewards - env_cfg.malformed_penalty * malformed
                - env_cfg.tool_call_cost * calls)  # fmt: skip

    def response(seg: Segment, score: float, text: str, **episode_fields: Any) -> Response:
        return Response(token_ids=seg.token_ids, logprobs=seg.logprobs, reward=score,
                        correct=res.correct, format_ok=res.format_ok, reason=res.reason,
                        finish_reason=seg.turns[-1].finish_reason, reward_components=components,
                        text=text, weight_versions=seg.weight_versions(),
                        **episode_fields)  # fmt: skip

    if not episode.multi_turn:
        return [response(episode.segments[0], res.score, episode.final_text)] if turns else []
    out = []
    for k, seg in enumerate(episode.segments):
        if not seg.token_ids:
            continue
        out.append(
            response(
                seg,
                credit(k),
                conversation.decode(seg.token_ids),
                loss_mask=seg.loss_mask,
                turns=[
                    Turn(
                        start=t.start,
                        end=t.end,
                        observation_end=t.observation_end,
                        reward=placed.get(id(t), 0.0),
                        has_reward=id(t) in placed,
                        weight_version=t.weight_version or 0,
                        text=conversation.decode(seg.token_ids[t.start : t.end]),
                        observation=conversation.decode(seg.token_ids[t.end : t.observation_end]),
                        tool_calls=[
                            ToolCall(
                                name=c.name,
                                arguments=c.arguments,
                                error=c.error,
                                latency_s=c.latency_s,
                                malformed=c.malformed,
                            )
                            for c in t.tool_calls
                        ],
                    )
                    for t in seg.turns
                ],
                prompt_token_ids=seg.prompt_ids if seg.prompt_ids != group_prompt else [],
                episode=index,
                segment=k,
                end_reason=episode.end_reason,
            )
        )
    return out
