"""The allocation-per-step contract (``dynamo_rl/contracts/step_allocation.py``): a count equal to
uniform n is "at", one more "above", one less "below"; the skipped prompts are what the groups
carry; the record, its reading back and the step line's form."""

from __future__ import annotations

import pytest

from dynamo_rl.codec import Response, TrajectoryGroup, decode_group
from dynamo_rl.contracts.step_allocation import RECORD_FIELDS, StepAllocation, compare


@pytest.mark.parametrize(
    ("allocated", "side"), [(0, "below"), (3, "below"), (4, "at"), (5, "above"), (16, "above")]
)
def test_a_count_is_told_against_uniform_n(allocated: int, side: str) -> None:
    assert compare(allocated, 4) == side


def group(allocated_n: int, skipped: int = 0) -> TrajectoryGroup:
    g = TrajectoryGroup(
        prompt_id=f"p{allocated_n}", prompt_token_ids=[3], allocated_n=allocated_n,
        responses=[Response(token_ids=[5], logprobs=[-1.0], reward=1.0)] * max(allocated_n, 1),
    )  # fmt: skip
    StepAllocation.stamp(skipped, g)
    return decode_group(g.SerializeToString())  # what the learner reads back


def test_a_steps_groups_are_counted_by_side_and_their_carried_skips_summed() -> None:
    consumed = [group(4, skipped=2), group(5), group(4), group(3, skipped=1), group(8), group(2)]
    allocation = StepAllocation.of(consumed, uniform_n=4)
    assert allocation == StepAllocation(above=2, at=2, below=2, skipped=3)
    assert allocation.record() == {
        "alloc_above": 2, "alloc_at": 2, "alloc_below": 2, "alloc_skipped": 3,
    }  # fmt: skip
    assert tuple(allocation.record()) == RECORD_FIELDS
    assert StepAllocation.of([group(4)], uniform_n=4) == StepAllocation(at=1)
    assert StepAllocation.of([], uniform_n=4) == StepAllocation()


def test_the_record_reads_back_and_the_step_line_shows_it() -> None:
    allocation = StepAllocation(above=3, at=4, below=1, skipped=2)
    record = {"step": 7, "loss": 0.1, **allocation.record()}
    assert StepAllocation.from_record(record) == allocation
    assert allocation.line() == "alloc +3 =4 -1 skip 2"
    assert StepAllocation.from_record({"step": 7, "loss": 0.1}) is None  # SFT, in-process
    assert StepAllocation.from_record({**record, "alloc_skipped": None}) is None
