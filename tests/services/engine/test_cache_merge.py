"""Rows joining a running batch (``engine.batching: continuous``): their cache rows appended to
the batch's give the logits of one forward pass over each row's whole sequence, whichever side is
the wider, and a step decoded after the merge still does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learner.tiny_model import build_tiny_model
from services.engine.batch_loop import BatchGenerator
from services.engine.kv_cache import merge as _merge
from services.engine.kv_cache import mergeable as _mergeable
from services.engine.kv_cache import trim as _trim
from tests.services.engine.engine_util import load_reference


@pytest.fixture(scope="module")
def generator(tmp_path_factory: pytest.TempPathFactory) -> BatchGenerator:
    path = build_tiny_model(
        tmp_path_factory.mktemp("merge") / "model",
        hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
    )  # fmt: skip
    gen = BatchGenerator(load_reference(Path(path)), eos_token_ids=[], pad_token_id=0,
                         decode=str, batching="continuous")  # fmt: skip
    yield gen
    gen.close()


def _last_logits(model: torch.nn.Module, row: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([row])).logits[0, -1].float()


@pytest.mark.parametrize(
    ("running", "joining"),
    [
        ([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]], [[20, 21]]),  # the batch is wider
        ([[5, 6]], [[30, 31, 32, 33, 34, 35], [36, 37, 38]]),  # the joining rows are wider
    ],
)
@torch.inference_mode()
def test_merged_rows_decode_as_one_forward_pass(
    generator: BatchGenerator, running: list[list[int]], joining: list[list[int]]
) -> None:
    model = generator.model
    state = generator._prefill(running)
    assert _mergeable(state[0])
    cache, logits, mask, pos = _merge(state, generator._prefill(joining))
    rows = running + joining
    want = torch.stack([_last_logits(model, r) for r in rows])
    assert torch.allclose(logits, want, atol=1e-4)
    # One more token per row through the merged cache.
    nxt = [40 + k for k in range(len(rows))]
    mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
    step = generator._forward(torch.tensor(nxt)[:, None], mask, pos[:, None], cache)
    want = torch.stack([_last_logits(model, [*r, t]) for r, t in zip(rows, nxt, strict=True)])
    assert torch.allclose(step, want, atol=1e-4), float((step - want).abs().max())


@torch.inference_mode()
def test_positions_of_finished_rows_are_dropped(generator: BatchGenerator) -> None:
    """A long row finishes: the positions only it used leave the cache, and the rows left still
    decode as one forward pass over their own sequences."""
    model = generator.model
    rows = [list(range(5, 25)), [30, 31, 32], [40, 41, 42, 43]]
    cache, _logits, mask, pos = generator._prefill(rows)
    sel = torch.tensor([1, 2])
    cache.batch_select_indices(sel)
    mask, pos = _trim(cache, mask[sel]), pos[sel]
    assert mask.shape[1] == 4 and cache.layers[0].keys.shape[2] == 4
    nxt = [50, 51]
    mask = torch.cat([mask, mask.new_ones((2, 1))], dim=1)
    step = generator._forward(torch.tensor(nxt)[:, None], mask, pos[:, None], cache)
    want = torch.stack([_last_logits(model, [*r, t]) for r, t in zip(rows[1:], nxt, strict=True)])
    assert torch.allclose(step, want, atol=1e-4), float((step - want).abs().max())


def test_a_failed_join_fails_the_joining_request_only(
    generator: BatchGenerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The joining prompts' prefill raises: their request fails, the running one finishes."""
    import time

    from dynamo_rl.contracts.sampling import SamplingParams

    real = generator._prefill
    bad = [90, 91, 92]

    def prefill(rows: list[list[int]]):
        if bad in rows:
            raise RuntimeError("no room for the joining rows")
        return real(rows)

    monkeypatch.setattr(generator, "_prefill", prefill)
    params = SamplingParams(max_tokens=480, temperature=0.0, ignore_eos=True)
    long = generator.submit([[5, 6, 7]], [params])
    deadline = time.monotonic() + 60
    while generator.pending():  # taken into a batch
        assert time.monotonic() < deadline
        time.sleep(0.005)
    short = generator.submit([bad], [SamplingParams(max_tokens=3, temperature=0.0)])
    with pytest.raises(RuntimeError, match="no room"):
        short.result(timeout=120)
    assert len(long.result(timeout=120)[0].token_ids) == 480
