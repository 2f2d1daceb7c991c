"""The sampler: the next token of each row of a batch from its logits, and the log-probs reported.

Pure functions of tensors (no model, no thread, no queue): :func:`sample` takes one step's
logits ``[n, V]`` and each row's settings (:class:`~dynamo_rl.contracts.sampling.SamplingParams`)
— temperature (0 = greedy: the argmax), top-k (None: off), top-p — and draws one token per row. A row with a per-row ``torch.Generator`` (:func:`row_generator`, a
seeded request's sample) draws its noise from it, so it gets the same tokens whatever else shares
its batch (up to float reduction order); the other rows share the engine's generator.

The returned log-probs (the sampled token's and the whole vector, for top alternatives) come from
one of two distributions, ``logprobs_mode``:

- ``processed`` (the default): the distribution the token was drawn from, after temperature,
  top-k and top-p (``log_softmax`` of the scaled, masked logits). With top-k and top-p off this
  is ``log_softmax(logits / T)``, what the learner computes on the same tokens (it divides its
  logits by each group's sampling temperature);
- ``raw``: the model's own distribution, ``log_softmax(logits)`` before any of them.

Greedy rows (temperature 0) report raw log-probs in either mode. Tokens that top-k/top-p removed
have no finite processed log-prob; as alternatives (:func:`top_alternatives`) they are reported
as :data:`MASKED_LOGPROB` (as vLLM does).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import torch

from dynamo_rl.contracts.sampling import SamplingParams

LOGPROBS_MODES = ("processed", "raw")
"""Which distribution returned log-probs come from (see the module docstring)."""
MASKED_LOGPROB = -9999.0
"""A top alternative that top-k/top-p removed, in ``processed`` mode (JSON has no -inf)."""


class Draw(NamedTuple):
    """One step's draw: per row the token, its log-prob, and the whole log-prob vector ``[n, V]``
    (both in ``logprobs_mode``); tokens and their log-probs on the CPU."""

    tokens: torch.Tensor
    token_logprobs: torch.Tensor
    logprobs: torch.Tensor


def sample_seed(seed: int, k: int) -> int:
    """The seed of sample ``k`` of a request seeded with ``seed``: a hash of the pair, so distinct
    request seeds give independent streams (``seed + k`` made sample 1 of seed 5 sample 0 of
    seed 6). 63 bits: any value ``torch.Generator.manual_seed`` takes."""
    digest = hashlib.blake2b(f"{seed}:{k}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def row_generator(seed: int | None) -> torch.Generator | None:
    """A row's own noise source (CPU, where generators live); None: unseeded."""
    return None if seed is None else torch.Generator(device="cpu").manual_seed(seed)


def filter_logits(
    scaled: torch.Tensor, top_ks: Sequence[int], top_ps: Sequence[float]
) -> torch.Tensor:
    """``scaled`` with the tokens each row's top-k (0: off) and top-p (1.0: off) remove set to
    -inf. top-k keeps the ``k`` largest (ties with the k-th kept too); top-p drops a token when
    the mass before it already reaches ``p`` (so at least one token is kept)."""
    dev = scaled.device
    if any(top_ks):
        kmax = max(top_ks)
        kth = torch.topk(scaled, kmax, dim=-1).values
        idx = torch.tensor([(k or kmax) - 1 for k in top_ks], device=dev)
        thresh = kth.gather(1, idx[:, None])
        off = torch.tensor([k == 0 for k in top_ks], device=dev)[:, None]
        scaled = scaled.masked_fill((scaled < thresh) & ~off, float("-inf"))
    if any(p < 1.0 for p in top_ps):
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs_sorted = sorted_logits.softmax(-1)
        cum = probs_sorted.cumsum(-1)
        p = torch.tensor(list(top_ps), device=dev)[:, None]
        drop_sorted = (cum - probs_sorted) >= p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def sample(
    logits: torch.Tensor,
    rows: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    rng: torch.Generator,
    logprobs_mode: str = "processed",
) -> Draw:
    """One token per row of ``logits`` ``[n, V]``, drawn with that row's settings and generator
    (None: from ``rng``); see the module docstring for the log-probs."""
    logp = torch.log_softmax(logits, dim=-1)
    n, vocab = logits.shape
    temps = [r.temperature for r in rows]
    greedy = [t == 0.0 for t in temps]
    if all(greedy):
        tokens = logits.argmax(-1)
    else:
        dev = logits.device
        scaled = logits / torch.tensor([t if t > 0 else 1.0 for t in temps], device=dev)[:, None]
        top_ks = [k if (k := r.top_k) is not None and k < vocab else 0 for r in rows]
        scaled = filter_logits(scaled, top_ks, [r.top_p for r in rows])
        probs = scaled.softmax(-1)
        # Exponential race (argmax p/E, E ~ Exp(1)) is exact categorical sampling and lets each
        # seeded row draw its noise from its own generator.
        noise = torch.empty((n, vocab), dtype=probs.dtype)  # CPU: generators live there
        unseeded = [i for i, g in enumerate(generators) if g is None]
        if unseeded:
            noise[unseeded] = torch.empty((len(unseeded), vocab), dtype=probs.dtype).exponential_(
                generator=rng
            )
        for i, g in enumerate(generators):
            if g is not None:
                noise[i].exponential_(generator=g)
        tokens = (probs / noise.to(probs.device)).argmax(-1)
        if any(greedy):
            g = torch.tensor(greedy, device=dev)
            tokens = torch.where(g, logits.argmax(-1), tokens)
        if logprobs_mode == "processed":
            # The distribution the tokens were drawn from; greedy rows report the raw one.
            processed = torch.log_softmax(scaled, dim=-1)
            if any(greedy):
                processed = torch.where(torch.tensor(greedy, device=dev)[:, None], logp, processed)
            logp = processed
    token_lp = logp.gather(1, tokens[:, None])[:, 0]
    return Draw(tokens.cpu(), token_lp.cpu(), logp)


def top_alternatives(logprobs: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens of one row's log-prob vector and their log-probs, a removed
    token's as :data:`MASKED_LOGPROB`."""
    vals, idx = torch.topk(logprobs, k)
    vals = vals.clamp(min=MASKED_LOGPROB)
    return list(zip(idx.tolist(), vals.tolist(), strict=True))
