"""Bad input is not a crash: prompt lengths checked at load (drop, truncate, error), a prompt the
engine still refuses dead-lettered while the run goes on, and a dataset whose ``data_source`` has no
reward route refused before anything runs. A real engine, reward service, allocator and Redis."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from dynamo_rl.codec import decode_entry
from dynamo_rl.config import ExperimentConfig, load_config
from dynamo_rl.config.reward import RewardConfig, unrouted
from dynamo_rl.contracts.stream import TrajectoryReader
from dynamo_rl.keys import dead_letter_stream, trajectory_stream
from dynamo_rl.notices import Notices, read_notices
from services.rollout.build import load_tokenizer, model_context, prompt_limit
from services.rollout.data_check import length_hint, scorer_of
from services.rollout.datasets import (
    DatasetError,
    PromptRenderer,
    check_prompt_lengths,
    load_records,
)
from services.rollout.worker import RolloutWorker, build_worker
from tests.conftest import REPO, dynamo_rl_argv
from tests.services.rollout.helpers import run_worker, worker_config

NS = "lentest"
MAX_TOKENS = 8
CONTEXT = 512  # the tiny model's max_position_embeddings
LIMIT = CONTEXT - MAX_TOKENS  # the default rollout.max_prompt_len
LONG = (4, 5)  # rows whose prompts exceed it: 600+ characters, one token each


def _rows() -> list[dict]:
    rows = []
    for i in range(6):
        content = f"{i}+{i}=" if i not in LONG else "Add: " + "1+" * 300 + f"{i}="
        rows.append(
            {
                "data_source": "arith",
                "prompt": [{"role": "user", "content": content}],
                "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
                "extra_info": {"index": i},
            }
        )
    return rows


LONG_IDS = {f"arith-{i}" for i in LONG}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_rows()), path)
    return path


def config(redis_url: str, engine: str, reward: str, allocator: str, dataset: Path,
           model: Path, *extra: str) -> ExperimentConfig:  # fmt: skip
    return worker_config(
        NS, redis_url, engine, reward, allocator, dataset, f"rollout.tokenizer={model}",
        "rollout.batch_size=6", "rollout.shuffle=false", "rollout.allocation=uniform",
        "rollout.n=2", "rollout.n_min=1", f"rollout.sampling.max_tokens={MAX_TOKENS}", *extra,
    )  # fmt: skip


@pytest.fixture
def make_worker(redis_url, engine, reward, allocator, dataset, model, tmp_path):
    """Workers whose warnings for the user go to ``tmp_path``'s notices (as a run folder's)."""

    def make(*extra: str) -> RolloutWorker:
        cfg = config(redis_url, engine, reward, allocator, dataset, model, *extra)
        return build_worker(cfg, notices=Notices(tmp_path, "rollout"))

    return make


def run(worker: RolloutWorker, batches: int) -> int:
    return run_worker(worker, batches)


def trained(redis_url: str) -> list:
    """The stream's groups as the learner reads them (vocabulary and context checked): none may be
    dead-lettered, so a learner on this model trains on every one."""
    client = redis.Redis.from_url(redis_url)
    try:
        reader = TrajectoryReader(client, NS, vocab_size=259, max_seq_len=CONTEXT)
        reader.setup()
        entries = reader.read(100, block_ms=50)
        assert client.xlen(dead_letter_stream(NS)) == 0
        assert len(entries) == client.xlen(trajectory_stream(NS))
        return [e.group for e in entries]
    finally:
        client.close()


def metric(worker: RolloutWorker, name: str, labels: dict[str, str] | None = None) -> float:
    return float(worker.metrics.metrics.registry.get_sample_value(name, labels or {}) or 0.0)


# -- the length policy, one function for the worker and eval ---------------------------------------


def test_the_limit_is_the_models_context_minus_max_tokens(model: Path) -> None:
    assert model_context(str(model)) == CONTEXT
    assert model_context("/nonexistent") is None
    cfg = load_config(None, [f"rollout.sampling.max_tokens={MAX_TOKENS}"], env={})
    assert prompt_limit(cfg, str(model)) == LIMIT
    assert prompt_limit(cfg, None) is None  # unknown context: no limit at load
    cfg = load_config(None, ["rollout.max_prompt_len=100"], env={})
    assert prompt_limit(cfg, str(model)) == 100  # set: it wins
    cfg = load_config(None, [f"rollout.sampling.max_tokens={CONTEXT}"], env={})
    with pytest.raises(ValueError, match=r"rollout\.sampling\.max_tokens"):
        prompt_limit(cfg, str(model))


def test_check_prompt_lengths_counts_and_applies_each_policy(model: Path, dataset: Path) -> None:
    records = load_records(dataset)
    renderer = PromptRenderer(load_tokenizer(str(model)))
    full = {r.prompt_id: renderer.render(r.prompt)[1] for r in records}
    assert all(len(full[p]) > LIMIT for p in LONG_IDS)
    assert all(len(ids) <= LIMIT for p, ids in full.items() if p not in LONG_IDS)

    drop = check_prompt_lengths(records, renderer, LIMIT, "drop")
    assert (drop.total, drop.over) == (6, 2)
    assert drop.line() == f"2 of 6 prompts exceed {LIMIT} tokens: dropped"
    assert {r.prompt_id for r in drop.records} == set(full) - LONG_IDS
    left = check_prompt_lengths(records, renderer, LIMIT, "truncate_left")
    right = check_prompt_lengths(records, renderer, LIMIT, "truncate_right")
    for check, keep in ((left, lambda ids: ids[-LIMIT:]), (right, lambda ids: ids[:LIMIT])):
        assert len(check.records) == 6 and check.over == 2
        for pid, ids in full.items():
            assert check.rendered[pid][1] == keep(ids)
    assert "truncated on the left" in left.line() and "on the right" in right.line()
    assert check_prompt_lengths(records, renderer, None, "error").over == 0
    with pytest.raises(DatasetError, match=rf"2 of 6 prompts exceed {LIMIT} tokens: refused"):
        check_prompt_lengths(records, renderer, LIMIT, "error")
    with pytest.raises(DatasetError, match="no prompt is left"):
        check_prompt_lengths(records, renderer, 3, "drop")


# -- the worker ------------------------------------------------------------------------------------


def test_worker_drops_long_prompts_at_load_and_trains_on_the_rest(
    make_worker, redis_url, caplog: pytest.LogCaptureFixture, dataset: Path, tmp_path: Path
) -> None:
    with caplog.at_level(logging.INFO):
        worker = make_worker()
    assert f"2 of 6 prompts exceed {LIMIT} tokens: dropped" in caplog.text
    assert metric(worker, "dynamo_rollout_prompts_over_length_total", {"action": "dropped"}) == 2
    # A warning for the user, once, with the setting to change (a third of the rows is dropped).
    (notice,) = read_notices(tmp_path)
    assert (notice.kind, notice.about) == ("prompts_over_length", str(dataset))
    assert notice.message == (
        f"{dataset}: 2 of 6 prompts exceed {LIMIT} tokens: dropped; 33% of the prompts are "
        f"dropped: to keep them, lower rollout.sampling.max_tokens ({MAX_TOKENS}; prompts get the "
        f"model's context of {CONTEXT} tokens minus it) or use a model with a longer context, or "
        "set rollout.prompt_len_policy=truncate_left"
    )
    assert run(worker, 2) == 2
    groups = trained(redis_url)
    assert len(groups) == 8  # two batches of the four prompts that fit
    assert not {g.prompt_id for g in groups} & LONG_IDS


@pytest.mark.parametrize("policy", ["truncate_left", "truncate_right"])
def test_worker_truncates_long_prompts_and_trains_on_them(
    make_worker, redis_url, policy: str, model: Path
) -> None:
    worker = make_worker(f"rollout.prompt_len_policy={policy}")
    assert metric(worker, "dynamo_rollout_prompts_over_length_total", {"action": "truncated"}) == 2
    full = PromptRenderer(load_tokenizer(str(model))).render(_rows()[4]["prompt"])[1]
    assert run(worker, 1) == 1
    groups = {g.prompt_id: g for g in trained(redis_url)}
    assert len(groups) == 6
    for pid in LONG_IDS:
        assert len(groups[pid].prompt_token_ids) == LIMIT
    kept = full[-LIMIT:] if policy == "truncate_left" else full[:LIMIT]
    assert list(groups["arith-4"].prompt_token_ids) == kept


def test_max_prompts_trains_on_the_files_first_rows_only(make_worker, redis_url) -> None:
    # The pool is cut before the length check: of the first five rows, the long one is dropped.
    worker = make_worker("rollout.max_prompts=5")
    assert metric(worker, "dynamo_rollout_prompts_over_length_total", {"action": "dropped"}) == 1
    assert run(worker, 2) == 2
    ids = [g.prompt_id for g in trained(redis_url)]
    assert len(ids) == 8 and set(ids) == {"arith-0", "arith-1", "arith-2", "arith-3"}


def test_worker_refuses_the_dataset_under_error(make_worker) -> None:
    with pytest.raises(DatasetError, match=rf"2 of 6 prompts exceed {LIMIT} tokens: refused"):
        make_worker("rollout.prompt_len_policy=error")


def test_a_prompt_the_engine_refuses_is_dead_lettered_and_the_run_goes_on(
    make_worker, redis_url, tmp_path: Path
) -> None:
    # No limit at load: the engine itself refuses the long prompts (HTTP 422, over its context).
    worker = make_worker("rollout.max_prompt_len=100000")
    assert run(worker, 2) == 2
    client = redis.Redis.from_url(redis_url)
    try:
        groups = [decode_entry(f) for _id, f in client.xrange(trajectory_stream(NS))]
        letters = client.xrange(dead_letter_stream(NS))
    finally:
        client.close()
    # Batch 0: the four that fit; the refused two are served no more, so batch 1 is those four.
    assert [g.prompt_id for g in groups] == [f"arith-{i}" for i in (0, 1, 2, 3) * 2]
    assert sorted(f[b"id"].decode() for _id, f in letters) == sorted(
        f"prompt:{p}" for p in LONG_IDS
    )
    for _id, fields in letters:
        reason = fields[b"reason"].decode()
        assert "HTTP 422" in reason and "context" in reason, reason
        payload = json.loads(fields[b"payload"])
        assert payload["data_source"] == "arith" and payload["prompt_tokens"] > CONTEXT
    assert metric(worker, "dynamo_rollout_prompts_refused_total") == 2
    assert worker.refused == 2
    # One warning for the user (the log has both prompts).
    assert [n.kind for n in read_notices(tmp_path)] == ["prompt_refused"]
    assert re.match(r"prompt arith-[45] refused by the engine, dead-lettered: .*HTTP 422",
                    read_notices(tmp_path)[0].message)  # fmt: skip


# -- routes ----------------------------------------------------------------------------------------


def test_unrouted_names_sources_without_a_route_of_their_kind() -> None:
    cfg = RewardConfig()
    sources = {"openai/gsm8k": "math", "aime_2025": "math", "mystery": "math", "apps": "code",
               "chat": "judge", "lighteval/MATH": "code"}  # fmt: skip
    # A judge needs no route; a code row under a math route is not routed.
    assert unrouted(cfg, sources) == {"mystery": "math", "lighteval/MATH": "code"}
    cfg = load_config(None, ["reward.composite.mystery.components=[{kind: math}]"], env={}).reward
    assert unrouted(cfg, {"mystery": "math"}) == {}
    cfg = load_config(None, ["reward.routes.mystery*={kind: math}"], env={}).reward
    assert unrouted(cfg, {"mystery-2": "math"}) == {}
    for star in ("reward.routes.*={kind: code}", "reward.composite.*.components=[{kind: math}]"):
        cfg = load_config(None, [star], env={}).reward
        assert unrouted(cfg, {"mystery": "math"}) == {}, star


def test_worker_refuses_an_unrouted_data_source_before_it_starts(
    redis_url, engine, reward, allocator, model, tmp_path: Path
) -> None:
    data = tmp_path / "mystery.jsonl"
    rows = [{"prompt": "1+1=", "answer": "2", "data_source": "mystery/set"},
            {"prompt": "2+2=", "answer": "4", "data_source": "openai/gsm8k"}]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parts = (redis_url, engine, reward, allocator, data, model)
    with pytest.raises(ValueError, match=r"data_source 'mystery/set' \(math\)") as err:
        build_worker(config(*parts))
    assert "openai/gsm8k (math)" in str(err.value)  # the routes that exist
    assert "'openai/gsm8k'" not in str(err.value)  # a routed source is not named
    build_worker(config(*parts, "reward.routes.mystery/*={kind: math}"))
    build_worker(config(*parts, "reward.routes.*={kind: math}"))

    # The command: exit 2 with the message, nothing pushed.
    argv = dynamo_rl_argv("rollout", "--dataset", str(data), "--tokenizer", str(model),
                          f"endpoints.redis_url={redis_url}", f"endpoints.engine_urls=[{engine}]",
                          f"rollout.namespace={NS}")  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no reward route for data_source 'mystery/set'" in done.stderr
    assert "Traceback" not in done.stderr
    # The data check (up's, before training) refuses it the same way.
    done = subprocess.run([*argv, "--check-data", str(tmp_path / "summary.json")],
                          capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "no reward route for data_source 'mystery/set'" in done.stderr
    assert not (tmp_path / "summary.json").exists()


def test_the_data_check_says_what_the_worker_will_train_on(
    dataset: Path, model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "summary.json"
    argv = dynamo_rl_argv("rollout", "--check-data", str(out), f"rollout.dataset={dataset}",
                          f"engine.model={model}", f"rollout.sampling.max_tokens={MAX_TOKENS}",
                          f"run.dir={tmp_path / 'run'}")  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert summary == {
        "dataset": str(dataset), "rows": 6, "kept": 4, "over": 2, "limit": LIMIT,
        "policy": "drop", "line": f"2 of 6 prompts exceed {LIMIT} tokens: dropped",
        "context": CONTEXT, "max_tokens": MAX_TOKENS, "max_prompt_len": None,
        "max_prompts": None, "hint": summary["hint"],
        "sources": [{"data_source": "arith", "kind": "math", "rows": 6,
                     "scorer": "math, last_boxed (reward.routes.arith)"}],
    }  # fmt: skip
    assert summary["hint"].startswith("33% of the prompts are dropped: to keep them, lower ")
    # A check, not a worker: no warning in the run folder (the worker writes it when it starts).
    assert not (tmp_path / "run" / "warnings.jsonl").exists()
    renderer, records = PromptRenderer(load_tokenizer(str(model))), load_records(dataset)
    fits = load_config(None, ["rollout.max_prompt_len=10000"], env={})
    lengths = check_prompt_lengths(records, renderer, 10000, "drop")
    assert length_hint(fits, lengths, str(model)) is None
    # Without a tokenizer the check names the setting, as the worker does.
    argv = dynamo_rl_argv("rollout", "--check-data", str(out), f"rollout.dataset={dataset}")
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "set rollout.tokenizer (or engine.model)" in done.stderr
    policy = "rollout.prompt_len_policy=truncate_left"
    cfg = load_config(None, ["rollout.max_prompt_len=100", policy], env={})
    lengths = check_prompt_lengths(records, renderer, 100, "truncate_left")
    assert length_hint(cfg, lengths, str(model)) == (
        "33% of the prompts are truncated: to keep them whole, raise rollout.max_prompt_len (100)"
    )


def test_the_scorer_of_each_source_is_its_route_or_composite_spec() -> None:
    cfg = load_config(None, ["reward.composite.mine.components=[{kind: math}]",
                             "reward.routes.apps*={kind: code, scoring: all_or_nothing}"],
                      env={}).reward  # fmt: skip
    assert scorer_of(cfg, "openai/gsm8k", "math") == "math, gsm8k (reward.routes.openai/gsm8k)"
    assert scorer_of(cfg, "apps-x", "code") == "code, all_or_nothing (reward.routes.apps*)"
    assert scorer_of(cfg, "mine", "math") == "composite reward.composite.mine"
    assert scorer_of(cfg, "chat", "judge") == "judge"
    assert scorer_of(cfg, "openai/gsm8k", "code") == "code, no route"


# -- eval ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_eval_on_long_prompts_prints_a_result_not_a_traceback(model: Path, tmp_path: Path) -> None:
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows()))

    def evaluate(*extra: str) -> tuple[dict, str]:
        out = tmp_path / "out.json"
        argv = dynamo_rl_argv("eval", "--model", str(model), "--data", str(data), "--n", "2",
                              "--out", str(out), f"rollout.sampling.max_tokens={MAX_TOKENS}",
                              *extra)  # fmt: skip
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        result = json.loads(out.read_text())
        [bench] = result["benchmarks"].values()  # the counts are per benchmark file
        return {**bench, "prompts": result["prompts"]}, done.stderr

    result, err = evaluate()  # the default policy: drop, reported before any sampling
    assert f"2 of 6 prompts exceed {LIMIT} tokens: dropped" in err
    assert result["prompts"] == 4 and result["prompts_over_length"]["over"] == 2
    # No limit at load: the engine refuses the two; they are left out and counted, in one line.
    result, err = evaluate("rollout.max_prompt_len=100000")
    assert "2 of 6 prompts refused by the engine, left out" in err
    assert result["prompts"] == 4 and result["prompts_refused"] == 2


@pytest.mark.slow
def test_truncated_prompts_train_in_the_learner(make_worker, redis_url, model, tmp_path) -> None:
    """The worker's groups of truncated prompts train: one learner step (torchrun, the same
    model) on all six, none dead-lettered."""
    from learner.steplog import read_log
    from tests.learner.helpers import base_overrides, run_learner

    assert run(make_worker("rollout.prompt_len_policy=truncate_left"), 1) == 1
    overrides = base_overrides(model, tmp_path / "run", redis_url, NS)
    run_learner(1, [*overrides, "learner.train_batch_size=6", "learner.max_steps=1",
                    f"learner.max_seq_len={CONTEXT}"], tmp_path / "learner.log")  # fmt: skip
    [step] = read_log(tmp_path / "run" / "metrics.jsonl")
    assert step["groups"] == 6 and step["groups_skipped"] == 0
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.xlen(dead_letter_stream(NS)) == 0
    finally:
        client.close()
