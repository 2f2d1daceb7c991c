"""Turning trajectory groups into padded tensors, and splitting a batch over ranks.

Every rank holds the whole batch as plain lists (rank 0 read it and broadcast it), so anything
computed over the batch — group advantages, loss denominators — is identical on every rank without
communication. Each rank then trains on a contiguous share of each mini-batch's responses.

Layout of a micro-batch: prompts left-padded to the longest prompt ``P``, responses right-padded to
the longest response ``T``; the model sees ``[B, P + T]`` and the response tokens always occupy the
last ``T`` columns, so ``[B, T]`` tensors (log-probs, advantages, masks) line up with no gather.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from dynamo_rl.codec import group_sampling, response_versions
from dynamo_rl.contracts.generation import response_episode


@dataclass
class Sample:
    """One response with its prompt (plain Python, cheap to broadcast)."""

    prompt: list[int]
    response: list[int]
    sampling_logprobs: list[float]
    reward: float
    correct: bool
    group: int
    staleness: int = 0
    """Learner's weight version minus the oldest version among the response's tokens."""
    version_spread: int = 0
    """Newest minus oldest weight version among its tokens (0: sampled by one version; more
    when the response spans interruptible updates)."""
    episode: int | None = None
    """Multi-turn episodes: the episode (within the group) this sample is a segment of; the
    segments of a forked episode share it. None: a single-turn response, an episode of its own."""
    truncated: bool = False
    temperature: float = 1.0
    """Temperature the response was sampled at; the learner divides its logits by it."""
    loss_mask: list[int] | None = None
    """Multi-turn episodes: 1 at model tokens, 0 at observation tokens (None: all trained)."""
    turn_rewards: list[tuple[int, float]] | None = None
    """Multi-turn episodes: (token position, reward) of each turn reward the environment placed;
    ``reward`` already includes them (its remainder — the outcome and the later segments' turn
    rewards — goes on the last trained token)."""
    turns: int = 0
    """Multi-turn episodes: model turns in this sample (0: single-turn)."""
    tool_calls: int = 0
    """Multi-turn episodes: tool calls made in this sample's turns."""
    tool_errors: int = 0
    """Multi-turn episodes: those of the calls that failed or were malformed."""
    teacher_logprobs: list[float] | None = None
    """On-policy distillation: the teacher's log-prob of each response token
    (``rollout.teacher``; None: no teacher scored it)."""
    observations_trained: bool = False
    """The mask ablation (``learner.algorithm.train_observations``): the observation tokens
    (loss mask 0) are trained too."""

    def trained(self) -> list[float]:
        """1.0 at each response token the loss counts, 0.0 at observation tokens (unless the
        ablation trains them)."""
        if self.loss_mask is None or self.observations_trained:
            return [1.0] * len(self.response)
        return [float(m) for m in self.loss_mask]

    def unsampled(self) -> list[float]:
        """1.0 at the tokens the ablation trains that the engine did not sample (0.0 elsewhere):
        their sampling log-prob is no log-prob."""
        if self.loss_mask is None or not self.observations_trained:
            return [0.0] * len(self.response)
        return [1.0 - float(m) for m in self.loss_mask]

    @property
    def model_tokens(self) -> int:
        """Tokens the loss counts (length normalisation, overlong penalties)."""
        return int(sum(self.trained()))


def episode_stats(samples: list[Sample]) -> dict[str, float]:
    """The step record's figures of multi-turn samples (one per episode unless a chat template
    forked it): mean model turns, the share that called a tool, tool calls per sample, the share
    of calls that failed; empty when no sample is multi-turn."""
    episodic = [s for s in samples if s.turns]
    if not episodic:
        return {}
    calls = sum(s.tool_calls for s in episodic)
    return {
        "episode_turns_mean": sum(s.turns for s in episodic) / len(episodic),
        "tool_call_rate": sum(1 for s in episodic if s.tool_calls) / len(episodic),
        "tool_calls_mean": calls / len(episodic),
        "tool_error_rate": sum(s.tool_errors for s in episodic) / calls if calls else 0.0,
    }


def episode_ids(groups: Sequence[int], episodes: Sequence[int | None]) -> torch.Tensor:
    """``[N]`` each row's episode, numbered across the batch (the estimators' ``episode_ids``):
    rows of one group with one ``episode`` share a number, a row with None has its own."""
    seen: dict[tuple[int, ...], int] = {}
    keys = [
        (g, e) if e is not None else (i,)
        for i, (g, e) in enumerate(zip(groups, episodes, strict=True))
    ]
    return torch.tensor([seen.setdefault(k, len(seen)) for k in keys], dtype=torch.long)


def samples_from_groups(
    groups: list[Any], weight_version: int, train_observations: bool = False
) -> list[Sample]:
    """Flatten decoded ``TrajectoryGroup`` protobufs into samples; group index = list position.
    ``train_observations``: the mask ablation (:attr:`Sample.observations_trained`)."""
    out: list[Sample] = []
    for gi, g in enumerate(groups):
        prompt = list(g.prompt_token_ids)
        # The learner divides its logits by what the engine sampled at (greedy: 1.0).
        temperature = group_sampling(g).logit_temperature
        for r in g.responses:
            placed = [(t.end - 1, float(t.reward)) for t in r.turns if t.has_reward]
            versions = response_versions(g, r) or [int(g.weight_version)]
            out.append(
                Sample(
                    prompt=list(r.prompt_token_ids) if r.prompt_token_ids else prompt,
                    response=list(r.token_ids),
                    sampling_logprobs=list(r.logprobs),
                    reward=float(r.reward),
                    correct=bool(r.correct),
                    group=gi,
                    staleness=max(0, weight_version - min(versions)),
                    version_spread=max(versions) - min(versions),
                    episode=response_episode(r),
                    truncated=r.finish_reason == "length",
                    temperature=temperature,
                    loss_mask=list(r.loss_mask) if r.loss_mask else None,
                    turn_rewards=placed or None,
                    turns=len(r.turns),
                    tool_calls=sum(len(t.tool_calls) for t in r.turns),
                    tool_errors=sum(1 for t in r.turns for c in t.tool_calls if c.error),
                    observations_trained=train_observations,
                    teacher_logprobs=list(r.teacher_logprobs) or None,
                )
            )
    return out


@dataclass
class MicroBatch:
    """Padded tensors for a set of rows of the batch (``rows`` are batch indices).

    The collated inputs come first; the step fills the rest as it goes (old pass, then
    advantages, then IS weights), each ``[b, T]`` over response tokens unless noted, None until
    set or when its term is off."""

    rows: list[int]
    input_ids: torch.Tensor  # [b, P + T]
    attention_mask: torch.Tensor  # [b, P + T]
    response_ids: torch.Tensor  # [b, T]
    mask: torch.Tensor  # [b, T] float, 1 at the response tokens trained on (not observations)
    sampling_logprobs: torch.Tensor  # [b, T]
    temperature: torch.Tensor  # [b] float, each row's sampling temperature
    unsampled: torch.Tensor | None = None
    """The mask ablation: 1 at trained tokens the engine did not sample (observations)."""
    group_tokens: torch.Tensor | None = None
    """``[b]``: the trained-token count of each row's group over the whole batch (prompt-mean)."""
    old_logp: torch.Tensor | None = None
    """Log-probs under the weights at batch start (the old pass)."""
    old_entropy: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    """Critic values at batch start (with a critic)."""
    ref_logp: torch.Tensor | None = None
    """Reference-policy log-probs (with a KL term)."""
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    """The mismatch correction's weights (None: ``is_cap`` off)."""

    @property
    def response_len(self) -> int:
        return int(self.response_ids.shape[1])

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum().item())

    def to(self, device: torch.device) -> MicroBatch:
        moved = {
            f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
            for f in fields(self)
        }
        return MicroBatch(**moved)


def collate(samples: list[Sample], rows: list[int], pad_id: int) -> MicroBatch:
    """Pad ``rows`` of ``samples``; an empty ``rows`` gives a one-row dummy with no valid token
    (so a rank with fewer rows still runs the same number of FSDP collectives)."""
    if not rows:
        return MicroBatch(
            [],
            torch.full((1, 2), pad_id, dtype=torch.long),
            torch.ones(1, 2, dtype=torch.long),
            torch.full((1, 1), pad_id, dtype=torch.long),
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1),
        )
    chosen = [samples[i] for i in rows]
    p_len = max(len(s.prompt) for s in chosen)
    t_len = max(1, max(len(s.response) for s in chosen))
    b = len(chosen)
    input_ids = torch.full((b, p_len + t_len), pad_id, dtype=torch.long)
    attention = torch.zeros((b, p_len + t_len), dtype=torch.long)
    response = torch.full((b, t_len), pad_id, dtype=torch.long)
    mask = torch.zeros((b, t_len))
    sampling = torch.zeros((b, t_len))
    for i, s in enumerate(chosen):
        lp, lr = len(s.prompt), len(s.response)
        input_ids[i, p_len - lp : p_len] = torch.tensor(s.prompt)
        attention[i, p_len - lp : p_len + lr] = 1
        if lr:
            input_ids[i, p_len : p_len + lr] = torch.tensor(s.response)
            response[i, :lr] = torch.tensor(s.response)
            mask[i, :lr] = torch.tensor(s.trained())
            sampling[i, :lr] = torch.tensor(s.sampling_logprobs)
    temperature = torch.tensor([s.temperature for s in chosen], dtype=torch.float32)
    mb = MicroBatch(list(rows), input_ids, attention, response, mask, sampling, temperature)
    if any(s.observations_trained for s in chosen):
        unsampled = torch.zeros((b, t_len))
        for i, s in enumerate(chosen):
            unsampled[i, : len(s.response)] = torch.tensor(s.unsampled())
        mb.unsampled = unsampled
    return mb


def scale_by_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``logits [B, T, V] / temperature [B]`` row by row, as the engine scaled them to sample.

    Log-probs and entropies of the tempered distribution are what the samples were drawn from
    (verl divides the same way). In place, since the logits are the LM head's fresh output and
    neither the matmul nor the division saves it for backward: no second ``[B, T, V]`` buffer.
    All-ones temperatures return the logits untouched.
    """
    if bool((temperature == 1.0).all()):
        return logits
    return logits.div_(temperature.to(logits.dtype)[:, None, None])


def batch_mask(samples: list[Sample]) -> torch.Tensor:
    """``[N, T_max]`` mask of the whole batch's trained tokens (for batch-level advantage
    estimators): 1 at response tokens, 0 at padding and at observation tokens."""
    t_len = max(1, max((len(s.response) for s in samples), default=1))
    mask = torch.zeros((len(samples), t_len))
    for i, s in enumerate(samples):
        if s.response:
            mask[i, : len(s.response)] = torch.tensor(s.trained())
    return mask


def placed_turn_rewards(samples: list[Sample], mask: torch.Tensor) -> torch.Tensor | None:
    """Token rewards of a batch with per-turn rewards (None when no sample has one): each of the
    sample's own turn rewards on its turn's last model token, the rest of its reward (the outcome,
    and the turn rewards of later segments of its episode) on its last trained token."""
    if not any(s.turn_rewards for s in samples):
        return None
    from learner.algorithms import outcome_token_rewards

    outcome = torch.tensor(
        [s.reward - sum(r for _, r in s.turn_rewards or ()) for s in samples], dtype=torch.float32
    )
    out = outcome_token_rewards(outcome, mask)
    for i, s in enumerate(samples):
        for pos, r in s.turn_rewards or ():
            out[i, pos] += r
    return out


def to_rows(values: list[list[float]], t_len: int) -> torch.Tensor:
    """Right-pad per-row lists to ``[N, t_len]``."""
    out = torch.zeros((len(values), t_len))
    for i, v in enumerate(values):
        if v:
            out[i, : len(v)] = torch.tensor(v, dtype=out.dtype)
    return out


def mini_batches(samples: list[Sample], groups_per_mini: int) -> list[list[int]]:
    """Row indices of each mini-batch: consecutive whole groups (groups are never split)."""
    by_group: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_group.setdefault(s.group, []).append(i)
    order = list(by_group.values())
    return [
        [i for g in order[k : k + groups_per_mini] for i in g]
        for k in range(0, len(order), groups_per_mini)
    ]


def rank_share(rows: list[int], rank: int, world: int) -> list[int]:
    """This rank's contiguous share of ``rows`` (sizes differ by at most one)."""
    n = len(rows)
    start = rank * n // world
    end = (rank + 1) * n // world
    return rows[start:end]


def micro_splits(rows: list[int], micro: int, n_micro: int) -> list[list[int]]:
    """``n_micro`` consecutive chunks of at most ``micro`` rows (trailing ones may be empty)."""
    chunks = [rows[k : k + micro] for k in range(0, len(rows), micro)]
    return chunks + [[] for _ in range(n_micro - len(chunks))]


def num_micro(rows: list[int], world: int, micro: int) -> int:
    """Micro-batches every rank runs for a mini-batch: enough for the largest share."""
    largest = max(len(rank_share(rows, r, world)) for r in range(world))
    return max(1, math.ceil(largest / micro))
