"""reasoning-gym scoring inside a worker process: the runner of the ``reasoning_gym`` kind's pool.

A job is ``(task, config, entry, response)``: the task (from the item's ``data_source``), the
generator options the entry was made with, the entry in its typed JSON form
(:mod:`dynamo_rl.contracts.rg_entry`) and the model's response. The answer scored is the last
``<answer>...</answer>`` of the response (the library's own ``extract_answer``, as its training
recipes read it), else the whole response as it is; an empty one is no answer (``None``). The
score is the library's ``score_answer(answer, entry)`` on a dataset of the task built with the
entry's options (its scorer may read them: ``polynomial_equations``' penalties,
``word_ladder``'s path-length rule), partial credit as the library gives it.

Nothing the item holds makes the job fail: a ``score_answer`` that raises (``prime_factorization``
on an answer that is not a product of numbers) scores 0 with reason ``scorer_error`` and the
exception named; options the library refuses, or an entry that cannot be read back, score 0 with
reason ``bad_ground_truth``. A scorer that hangs or crashes the worker is the pool's timeout.

Some tasks' scorers ``eval`` the answer (``string_insertion``, ``spiral_matrix``,
``binary_matrix``, ``n_queens``; ``sympy.parse_expr`` in the integration, polynomial, countdown
and 24 tasks): model-written text runs as Python in this worker, under the pool's memory limit
and timeout but outside the code sandbox (docs/reward.md).
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Callable
from typing import Any

from dynamo_rl.contracts.rg_entry import decode_entry

CACHED_DATASETS = 32
"""Datasets (a task with its options) kept built per worker."""


def _result(score: float, reason: str, detail: str, answer: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "score": score,
        "correct": reason == "ok",
        "format_ok": answer is not None,
        "reason": reason,
        "detail": detail,
    }
    if answer is not None:
        out["answer"] = answer
    return out


def runner() -> Callable[[tuple[Any, ...]], dict[str, Any]]:
    """Import reasoning-gym (raises when it is not installed: the pool names the error) and
    return the function scoring one job."""
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    built: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()

    def dataset(task: str, config: dict[str, Any]) -> Any:
        key = (task, json.dumps(config, sort_keys=True))
        if key in built:
            built.move_to_end(key)
            return built[key]
        ds = reasoning_gym.create_dataset(task, **config)
        built[key] = ds
        if len(built) > CACHED_DATASETS:
            built.popitem(last=False)
        return ds

    def score(job: tuple[Any, ...]) -> dict[str, Any]:
        task, config, entry, response = job
        answer = extract_answer(response)
        if answer is None:
            answer = response if response.strip() else None
        try:
            decoded = decode_entry(entry)
        except ValueError as e:
            return _result(0.0, "bad_ground_truth", f"the entry cannot be read: {e}", answer)
        try:
            ds = dataset(task, config)
        except Exception as e:
            return _result(0.0, "bad_ground_truth", f"reasoning-gym refused the options of "
                           f"{task} {config}: {type(e).__name__}: {str(e)[:200]}", answer)  # fmt: skip
        try:
            value = ds.score_answer(answer, decoded)
        except Exception as e:
            return _result(0.0, "scorer_error", f"{task}'s score_answer raised "
                           f"{type(e).__name__}: {str(e)[:200]}", answer)  # fmt: skip
        try:
            got = float(value)
        except (TypeError, ValueError):
            got = math.nan
        if not math.isfinite(got):
            return _result(0.0, "scorer_error",
                           f"{task}'s score_answer returned {value!r}, not a number", answer)  # fmt: skip
        shown = "no answer" if answer is None else f"answer {answer[:200]!r}"
        reason = "ok" if got >= 1.0 else ("no_answer" if answer is None else "wrong_answer")
        return _result(got, reason, f"{task}: score_answer {got:.4g} on {shown}", answer)

    return score
