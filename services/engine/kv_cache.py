"""A batch's KV cache: built over left-padded prompts, rows appended (a join) and positions dropped.

A batch's state between two steps is a :class:`CacheState`: the model's cache (a transformers
``DynamicCache``), the next-token logits of each row, the attention mask ``[rows, width]`` and
each row's next position. Rows are left padded to the widest, and positions count real tokens
only, as in an unpadded forward pass.

- :func:`left_padded` lays out the prompts of a prefill;
- :func:`merge` appends the rows of a second state (prompts that join a running batch, prefilled on
  their own) to the first: the narrower side is left padded with zero keys and values its mask
  leaves out, so every row still decodes as one forward pass over its own sequence;
- :func:`trim` drops the leading positions no row attends to any more (their rows finished), so a
  batch that lives on through joins does not grow with every step it ran.

Only a cache of plain per-layer keys and values can be merged and trimmed (:func:`mergeable`); one
of another kind (sliding-window layers, quantised or offloaded ones) is rebuilt over every row
instead.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch


class CacheState(NamedTuple):
    """A batch between two steps (see the module docstring)."""

    cache: Any
    logits: torch.Tensor
    mask: torch.Tensor
    next_pos: torch.Tensor


def cache_kwarg(model: torch.nn.Module) -> str:
    """transformers 5 renamed ``past_key_values`` to ``cache``; accept both versions."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model: torch.nn.Module) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def left_padded(
    rows: list[list[int]], pad_token_id: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids, attention mask and positions of ``rows`` left padded to the longest one;
    positions count real tokens only."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[r, width - len(row) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def mergeable(cache: Any) -> bool:
    """Whether :func:`merge` can append rows to ``cache`` (and :func:`trim` drop positions):
    plain per-layer keys and values (no sliding window, no quantised or offloaded layers)."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # a transformers before per-layer caches: rebuild instead
        return False
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def merge(a: tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor],
          b: tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]) -> CacheState:  # fmt: skip
    """Rows of ``b`` (cache, next-token logits, attention mask, next positions) appended to
    ``a``'s, in place of ``a``'s cache: the narrower one is left padded to the wider one's length
    with zero keys and values that its mask leaves out, as the batch's first prefill pads. ``a``
    changes only once every new tensor is built (a failure leaves it whole)."""
    cache, logits, mask, pos = a
    other, logits_b, mask_b, pos_b = b
    width = max(mask.shape[1], mask_b.shape[1])

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        short = width - t.shape[dim]
        if not short:
            return t
        shape = list(t.shape)
        shape[dim] = short
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    kv = [
        (torch.cat([pad(layer.keys, 2), pad(new.keys, 2)]),
         torch.cat([pad(layer.values, 2), pad(new.values, 2)]))
        for layer, new in zip(cache.layers, other.layers, strict=True)
    ]  # fmt: skip
    mask = torch.cat([pad(mask, 1), pad(mask_b, 1)])
    logits, pos = torch.cat([logits, logits_b]), torch.cat([pos, pos_b])
    for layer, (keys, values) in zip(cache.layers, kv, strict=True):
        layer.keys, layer.values = keys, values
    return CacheState(cache, logits, mask, pos)


def trim(cache: Any, mask: torch.Tensor) -> torch.Tensor:
    """Drop the leading cache positions no row attends to any more (their rows finished); the
    trimmed mask."""
    first = int(mask.any(0).int().argmax())
    if first == 0:
        return mask
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
    return mask[:, first:]
