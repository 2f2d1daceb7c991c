"""The sampling settings, declared once: how an engine samples a response.

:class:`SamplingParams` is the one declaration of the settings, their defaults, bounds and
documentation. Every end uses it:

- the config: ``rollout.sampling`` is a ``SamplingParams`` (its keys are these fields, their bounds
  checked when the config loads);
- the rollout clients (``services/rollout/engines/``) send one with every request; at the HTTP
  edge it becomes the request body's sampling fields
  (:func:`dynamo_rl.contracts.engine.sampling_knobs`), the keys and values vLLM, SGLang and the
  embedded engine have always received;
- the embedded engine reads a request body back into one per sequence
  (:meth:`dynamo_rl.contracts.engine.SamplingKnobs.sampling`), which its batch loop and sampler
  use;
- the stream records a group's settings as the protobuf ``dynamo.v1.SamplingRecord``
  (:func:`dynamo_rl.codec.sampling_record`; :func:`dynamo_rl.codec.group_sampling` reads it
  back), and the learner recomputes log-probs at its :attr:`SamplingParams.logit_temperature`.

**top-k off is None** in this type. The edges take the other spellings and read them as None: -1
(vLLM's API, the stream's record, configs written before) and 0 (SGLang's); what leaves an edge is
what it always sent: no ``top_k`` in a JSON body, -1 in the protobuf record.

Constructing one checks nothing (the config and the HTTP models check what enters through them);
it reads top-k's other spellings as None and stores stop lists as tuples, so it stays hashable.
No torch, no protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import ConfigDict, Field

__all__ = ["SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample a response (see the module docstring)."""

    # How pydantic validates it where it is validated (the config): unknown keys are errors.
    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_tokens: Annotated[int, Field(ge=1)] = 256
    """Most tokens generated per response."""
    temperature: Annotated[float, Field(ge=0)] = 1.0
    """Softmax temperature (1.0: sample from the policy itself, as on-policy RL needs; 0:
    greedy)."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling mass (1.0: off)."""
    top_k: Annotated[int, Field(ge=-1)] | None = None
    """Top-k sampling (None: off; -1 and 0 are read as None)."""
    stop: tuple[str, ...] = ()
    """Strings that end a response (the engine's EOS always does)."""
    stop_token_ids: tuple[Annotated[int, Field(ge=0)], ...] = ()
    """Token ids that end a response, besides EOS."""
    seed: int | None = None
    """A request's seed. In the config, the base seed: each request gets its own seed derived
    from it, the batch, prompt and chunk (None: unseeded sampling)."""
    ignore_eos: bool = False
    """Sample past EOS up to ``max_tokens`` (tests and benchmarks that need set lengths)."""

    def __post_init__(self) -> None:
        if self.top_k is not None and self.top_k <= 0:
            object.__setattr__(self, "top_k", None)
        for name in ("stop", "stop_token_ids"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    @property
    def greedy(self) -> bool:
        """Temperature 0: the most likely token, every time."""
        return self.temperature == 0

    @property
    def logit_temperature(self) -> float:
        """What the learner divides its logits by to recompute these log-probs: the temperature,
        or 1.0 when greedy (no tempered distribution exists; the engines report the raw one)."""
        return self.temperature if self.temperature > 0 else 1.0
