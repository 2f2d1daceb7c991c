"""Name → function registries for the algorithm variants the learner can be configured with.

Every variant in a registry has the same call signature, so the learner looks a name up once and
calls the result without knowing which variant it got (no ``if name == "gae"`` anywhere):

- ``ADVANTAGE_ESTIMATORS[name](*, rewards, mask, group_ids, token_rewards=None, values=None,
  gamma=1.0, lam=1.0, episode_ids=None) -> (advantages[B, T], returns[B, T])`` — see
  ``AdvantageEstimator``;
- ``POLICY_LOSSES[name](logp, old_logp, advantages, mask, *, clip_low, clip_high,
  dual_clip=None, agg=..., normalizer=None, group_tokens=None) -> (loss, metrics)`` — see ``PolicyLoss``;
- ``IS_CORRECTIONS[name](old_logp, sampling_logp, mask, *, cap, low=None) -> ISWeights`` — the
  importance weights that correct the engine/learner mismatch, see ``ISCorrection``.

Registering a name twice is an error (a silent overwrite would make a config name mean whichever
module was imported last); looking up an unknown name raises ``UnknownNameError`` listing the
known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, Protocol, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., object])


class UnknownNameError(KeyError, ValueError):
    """A registry lookup with a name that is not registered (message lists the known names)."""

    def __str__(self) -> str:  # KeyError would repr() the message and add quotes
        return str(self.args[0]) if self.args else ""


class Registry(Mapping[str, F], Generic[F]):
    """A read-only mapping from names to functions, filled through ``register``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: register the function under ``name``; a duplicate name raises ValueError."""

        def decorate(fn: F) -> F:
            self.add(name, fn)
            return fn

        return decorate

    def add(self, name: str, fn: F) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items:
            raise ValueError(
                f"{self.kind} {name!r} is already registered (to {self._items[name].__qualname__})"
            )
        self._items[name] = fn

    def __getitem__(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._items)})"


GroupIds = torch.Tensor | Sequence[Hashable]


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator is called with (see :class:`AdvantageEstimator`)."""

    rewards: torch.Tensor
    mask: torch.Tensor
    group_ids: GroupIds
    token_rewards: torch.Tensor | None
    values: torch.Tensor | None
    gamma: float
    lam: float
    episode_ids: GroupIds | None = None


class AdvantageEstimator:
    """The one signature of every entry in ``ADVANTAGE_ESTIMATORS``.

    ``rewards[B]`` are outcome scores; ``token_rewards[B, T]`` (optional) are per-token rewards —
    when omitted, token-level estimators place each outcome reward on the last valid token.
    ``values[B, T]`` is required by critic-based estimators (``gae``) and ignored by the others.
    ``episode_ids[B]`` (optional) says which episode each row is a segment of: group statistics
    are taken over episodes (``learner.algorithms.advantages``); None: each row is one.
    Returns ``(advantages, returns)``, both ``[B, T]`` and zero at masked positions.

    Each variant is ``compute``, a function of the call's :class:`AdvantageInputs`; ``doc`` is the
    variant's docstring.
    """

    def __init__(
        self,
        name: str,
        compute: Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]],
        doc: str,
    ) -> None:
        self.__name__ = self.__qualname__ = f"_{name}_estimator"
        self.__doc__ = doc
        self.compute = compute

    def __call__(
        self,
        *,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        group_ids: GroupIds,
        token_rewards: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        gamma: float = 1.0,
        lam: float = 1.0,
        episode_ids: GroupIds | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.compute(
            AdvantageInputs(
                rewards, mask, group_ids, token_rewards, values, gamma, lam, episode_ids
            )
        )


class PolicyLoss(Protocol):
    """The one signature of every entry in ``POLICY_LOSSES`` (defaults differ per variant)."""

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        clip_low: float = ...,
        clip_high: float = ...,
        dual_clip: float | None = None,
        agg: str = ...,
        normalizer: float | torch.Tensor | None = None,
        group_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


class ISWeights(NamedTuple):
    """What an IS correction gives: ``[B, T]`` weights (0 at padding and at dropped tokens) and
    ``dropped`` (bool ``[B, T]``: valid tokens a masked mode left out)."""

    weights: torch.Tensor
    dropped: torch.Tensor


class ISCorrection(Protocol):
    """The one signature of every entry in ``IS_CORRECTIONS``: ``r_t = exp(old − sampling)`` per
    token, turned into weights (truncated at ``cap`` or masked outside ``[low, cap]``; ``low``
    defaults to ``1 / cap``) at the token, sequence or geometric-mean level."""

    def __call__(
        self,
        old_logp: torch.Tensor,
        sampling_logp: torch.Tensor,
        mask: torch.Tensor,
        *,
        cap: float,
        low: float | None = None,
    ) -> ISWeights: ...


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
IS_CORRECTIONS: Registry[ISCorrection] = Registry("IS correction")
