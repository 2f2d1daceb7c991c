"""The engine's batch loop (``services/engine/batch_loop.py``) in process, on a tiny model: its one
join rule, and what a running batch takes in under it — with ``static`` nothing, so a request that
arrives mid-batch is answered after the batch; with ``continuous`` the request joins (after
``JOIN_EVERY`` steps, up to ``max_batch_size`` rows) and is answered first, its tokens those of
a greedy decode by full forward passes and its log-probs those of a fresh forward pass (within
1e-4); a queued task or a job of another adapter stops the joining.

A request "arrives mid-batch" deterministically: a task queued to run between tokens holds the
running batch at a token boundary while the request is queued. The order in which requests
finish is recorded by their futures' callbacks, which run in the scheduler thread as each
finishes; waits have deadlines.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from dynamo_rl.contracts.sampling import SamplingParams
from learner.tiny_model import build_tiny_model
from services.engine.batch_loop import (
    JOIN_EVERY,
    JOIN_RULES,
    BatchGenerator,
    BatchStats,
    JoinRule,
)
from tests.services.engine.engine_util import load_reference, reference_greedy, reference_logprobs

DEADLINE_S = 120
LONG = [5, 6, 7]
SHORT = [20, 21]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = build_tiny_model(
        tmp_path_factory.mktemp("loop") / "model",
        hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
    )  # fmt: skip
    return load_reference(Path(path))


class Loop:
    """A :class:`BatchGenerator` whose batches are recorded and whose finished requests are
    named in the order they finished."""

    def __init__(self, model: torch.nn.Module, **kw: object) -> None:
        self.stats: list[BatchStats] = []
        self.finished: list[str] = []
        self.gen = BatchGenerator(model, eos_token_ids=[], pad_token_id=0, decode=str,
                                  on_batch=self.stats.append, batch_wait_s=0.05, **kw)  # fmt: skip

    def named(self, name: str, future: Future) -> Future:
        future.add_done_callback(lambda _f: self.finished.append(name))
        return future

    def submit(self, name: str, prompts: list[list[int]], max_tokens: int,
               adapter: str | None = None) -> Future:  # fmt: skip
        return self.named(name, self.gen.submit(prompts, [greedy(max_tokens)] * len(prompts),
                                                adapter))  # fmt: skip

    def hold(self) -> Callable[[], None]:
        """Hold the running batch at its next token boundary; wait until it is held; the
        function that releases it."""
        held, release = threading.Event(), threading.Event()

        def fn() -> None:
            held.set()
            assert release.wait(DEADLINE_S)

        task = self.gen.run_exclusive(fn, between_tokens=True)
        assert held.wait(DEADLINE_S), "the batch never reached a token boundary"

        def release_it() -> None:
            release.set()
            task.result(timeout=DEADLINE_S)

        return release_it


@pytest.fixture
def loop(model: torch.nn.Module, request: pytest.FixtureRequest) -> Iterator[Loop]:
    kw = getattr(request, "param", {})
    lp = Loop(model, **kw)
    yield lp
    lp.gen.close()


def test_the_join_rule() -> None:
    static, continuous = JOIN_RULES["static"], JOIN_RULES["continuous"]
    assert (static, continuous) == (JoinRule(None), JoinRule(JOIN_EVERY)) and JOIN_EVERY == 8
    assert not static.joins and continuous.joins
    for rule in (static, continuous, JoinRule(1)):
        assert rule.room(0, 0, 4) == 4  # a new batch takes up to max_batch_size
    assert [static.room(1, s, 4) for s in (0, 7, 8, 1000)] == [0, 0, 0, 0]
    assert [continuous.room(1, s, 4) for s in (0, 7, 8, 9)] == [0, 0, 3, 3]
    assert [continuous.room(r, 8, 4) for r in (2, 3, 4, 5)] == [2, 1, 0, 0]
    assert JoinRule(1).room(1, 1, 4) == 3


@pytest.mark.parametrize("loop", [{"batching": "static"}, {"batching": "continuous"}],
                         indirect=True, ids=["static", "continuous"])  # fmt: skip
def test_a_request_arriving_mid_batch_joins_only_under_continuous(
    loop: Loop, model: torch.nn.Module
) -> None:
    long = loop.submit("long", [LONG], 300)
    release = loop.hold()
    short = loop.submit("short", [SHORT], 4)
    release()
    [short_res] = short.result(timeout=DEADLINE_S)
    [long_res] = long.result(timeout=DEADLINE_S)
    assert short_res.token_ids == reference_greedy(model, SHORT, 4)
    assert long_res.token_ids == reference_greedy(model, LONG, 300)
    want = reference_logprobs(model, SHORT, short_res.token_ids)
    assert torch.allclose(torch.tensor(short_res.logprobs), want, atol=1e-4)
    if loop.gen.join.joins:
        assert loop.finished == ["short", "long"]
        # The long row decoded alone until the join, JOIN_EVERY steps at least; then two rows.
        first, joined = loop.stats[0], loop.stats[1]
        assert (first.sequences, first.rows) == (1, 1)
        assert first.generated_tokens >= JOIN_EVERY
        assert (joined.sequences, joined.rows) == (1, 2)
        assert len(loop.stats) == 2
    else:
        assert loop.finished == ["long", "short"]
        assert [(s.sequences, s.rows) for s in loop.stats] == [(1, 1), (1, 1)]
        assert loop.stats[0].generated_tokens == 300


@pytest.mark.parametrize("loop", [{"batching": "continuous", "max_batch_size": 2}],
                         indirect=True)  # fmt: skip
def test_joins_fill_the_batch_up_to_max_batch_size(loop: Loop, model: torch.nn.Module) -> None:
    long = loop.submit("long", [LONG], 300)
    release = loop.hold()
    short = loop.submit("short", [SHORT, [30, 31, 32]], 4)
    release()
    results = short.result(timeout=DEADLINE_S)
    long.result(timeout=DEADLINE_S)
    assert loop.finished == ["short", "long"]
    assert [r.token_ids for r in results] == [
        reference_greedy(model, SHORT, 4),
        reference_greedy(model, [30, 31, 32], 4),
    ]
    # One row joined at a time: never more than two rows.
    assert max(s.rows for s in loop.stats) == 2
    assert [(s.sequences, s.rows) for s in loop.stats[1:]] == [(1, 2), (1, 2)]


@pytest.mark.parametrize("loop", [{"batching": "continuous"}], indirect=True)
def test_a_queued_task_stops_the_joining(loop: Loop) -> None:
    long = loop.submit("long", [LONG], 200)
    release = loop.hold()
    task = loop.named("task", loop.gen.run_exclusive(lambda: None))
    short = loop.submit("short", [SHORT], 4)
    release()
    for f in (long, task, short):
        f.result(timeout=DEADLINE_S)
    assert loop.finished == ["long", "task", "short"]
    assert [(s.sequences, s.rows) for s in loop.stats] == [(1, 1), (1, 1)]


@pytest.mark.parametrize("loop", [{"batching": "continuous"}], indirect=True)
def test_a_job_of_another_adapter_does_not_join(loop: Loop) -> None:
    selected: list[str | None] = []
    loop.gen.select_adapter = lambda name: selected.append(name)  # the weights' version
    long = loop.submit("long", [LONG], 200)
    release = loop.hold()
    other = loop.submit("other", [SHORT], 4, adapter="lora-v1")
    release()
    long.result(timeout=DEADLINE_S)
    other.result(timeout=DEADLINE_S)
    assert loop.finished == ["long", "other"]
    assert selected == [None, "lora-v1"]


@pytest.mark.parametrize("loop", [{"batching": "continuous"}], indirect=True)
def test_rows_without_tokens_to_generate_are_answered_at_once(loop: Loop) -> None:
    [none] = loop.submit("none", [LONG], 0).result(timeout=DEADLINE_S)
    assert (none.token_ids, none.finish_reason, none.token_versions) == ([], "length", [])
    assert [(s.sequences, s.generated_tokens) for s in loop.stats] == [(1, 0)]
