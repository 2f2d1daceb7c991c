"""``dynamo-rl data reasoning-gym`` and the reward service's ``reasoning_gym`` kind, on every task
of the pinned reasoning-gym version.

Each task's entries are generated through the converter (the library's ``composite`` mixing that
one task), written and read back by the rollout worker's own loader, and sent to ONE real reward
service in one request: for each entry its own answer (bare and inside ``<answer>`` tags), a wrong
answer and a perturbed one. Each score must be what the library's own ``score_answer`` gives
in-process on the same entry, from the dataset that generated it (the entry as generated, never
serialised), or 0 with reason ``scorer_error`` naming the exception when that raises; no request
fails. No task is left out.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym
from reasoning_gym.composite import DatasetSpec
from reasoning_gym.factory import DATASETS
from reasoning_gym.utils import extract_answer

from dynamo_rl.config import load_config
from dynamo_rl.contracts import rg_entry
from services.rollout.datasets import check_routes, load_records, reward_item
from tasks.convert import main as data_main
from tasks.convert import write_rows
from tasks.reasoning_gym_data import generate, rows_of
from tests.services.reward.conftest import RewardServer, start_reward_server

SEED = 2
PER_TASK = 2
NO_ANSWER = {"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"}
"""The tasks of 0.1.25 whose entries have no single answer (``answer`` is None)."""


def test_the_contract_lists_the_pinned_versions_tasks() -> None:
    import importlib.metadata

    assert importlib.metadata.version("reasoning-gym") == rg_entry.VERSION
    assert set(rg_entry.TASKS) == set(DATASETS) - {"composite"}
    assert list(rg_entry.TASKS) == sorted(rg_entry.TASKS)


def _same(a: Any, b: Any, where: str = "entry") -> None:
    """``a == b`` with the types kept (a tuple is not a list; int keys are not strings)."""
    if getattr(a, "ndim", None) == 0:  # a numpy scalar comes back as the number it holds
        a = a.item()
    for plain in (str, float):  # and numpy's str_ and float64 as str and float
        if isinstance(a, plain):
            assert type(b) is plain and (a == b or (a != a and b != b)), where
            return
    assert type(a) is type(b), f"{where}: {type(a).__name__} came back as {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _perturbed(answer: str | None) -> str:
    """The answer with its first digit changed, else with a word added."""
    if not answer:
        return "x"
    m = re.search(r"\d", answer)
    if m is None:
        return answer + " x"
    digit = str((int(m.group()) + 1) % 10)
    return answer[: m.start()] + digit + answer[m.end() :]


def _scored_answer(response: str) -> str | None:
    """What the service scores (docs/reward.md): the last <answer>...</answer> (the library's
    extract_answer), else the whole response; an empty one is no answer."""
    found = extract_answer(response)
    if found is not None:
        return found
    return response if response.strip() else None


@dataclasses.dataclass
class Task:
    name: str
    reference: Any  # the dataset that generated the entries (the library's composite)
    entries: list[dict[str, Any]]
    config: dict[str, Any]
    split: str


CONFIGURED = {"min_num_decimal_places": 1, "max_num_decimal_places": 1, "precision": 4}
"""decimal_arithmetic's scorer reads its options: answers within 10^-max_num_decimal_places
score 1, so with these options an answer off by 0.05 scores 1 (0 under the defaults)."""


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    """Every task's entries as the library generates them, in-process, independently of the
    converter (the same seed and mixer); then decimal_arithmetic with options of its own."""
    out = []
    for name, config, split in [*((t, {}, "train") for t in rg_entry.TASKS),
                                ("decimal_arithmetic", CONFIGURED, "configured")]:  # fmt: skip
        ds = reasoning_gym.create_dataset(
            "composite", size=PER_TASK, seed=SEED, datasets=[DatasetSpec(name, 1.0, config)]
        )
        out.append(Task(name, ds, [ds[i] for i in range(PER_TASK)], config, split))
    return out


@pytest.fixture(scope="module")
def converted(tasks: list[Task], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All tasks converted by ``dynamo-rl data reasoning-gym``'s functions, in one parquet."""
    rows = []
    for task in tasks:
        options = {task.name: task.config}
        entries = generate([task.name], [1.0], PER_TASK, SEED, options)
        rows += rows_of(entries, options, split=task.split,
                        system_prompt="Answer in <answer></answer> tags.")  # fmt: skip
    return write_rows(rows, tmp_path_factory.mktemp("rg") / "all.parquet")


@pytest.fixture(scope="module")
def reward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    server = start_reward_server(tmp_path_factory.mktemp("rg-reward"),
                                 ["reward.code.enabled=false"])  # fmt: skip
    try:
        yield server
    finally:
        server.proc.stop()


def test_entries_keep_their_types_through_the_typed_json_form(tasks: list[Task]) -> None:
    for task in tasks:
        for entry in task.entries:
            wire = json.loads(json.dumps(rg_entry.encode_entry(entry)))
            _same(entry, rg_entry.decode_entry(wire), f"{task.name} entry")
    # A dict whose only key is a tag, and keys of several types, come back as they were.
    odd = {"m": {"__tuple__": [1]}, "k": {1: "a", (2, 3): {"x"}}, "f": float("inf")}
    _same(odd, rg_entry.decode_entry(json.loads(json.dumps(rg_entry.encode_entry(odd)))))
    with pytest.raises(TypeError, match=r"entry\.metadata\.grid: a object has no JSON form"):
        rg_entry.encode_entry({"metadata": {"grid": object()}})
    with pytest.raises(ValueError, match=r"entry\.__tuple__: expected a list"):
        rg_entry.decode_entry({"__tuple__": 3})


def test_every_task_converts_and_scores_as_the_library_scores_it(
    tasks: list[Task], converted: Path, reward: RewardServer
) -> None:
    records = load_records(converted)  # the rollout worker's own loader
    assert len(records) == len(tasks) * PER_TASK
    check_routes(records, load_config(None, [f"rollout.dataset={converted}"], env={}))
    items, expected = [], []
    for n, task in enumerate(tasks):
        mine = records[n * PER_TASK : (n + 1) * PER_TASK]
        for entry, record in zip(task.entries, mine, strict=True):
            assert record.data_source == f"reasoning_gym/{task.name}"
            assert record.kind == "reasoning_gym"
            assert record.prompt[-1] == {"role": "user", "content": entry["question"]}
            assert record.ground_truth == (entry["answer"] or "")
            answer = entry["answer"] or ""
            responses = [answer, f"Let me think.\n<answer>{answer}</answer>",
                         "definitely wrong", _perturbed(entry["answer"])]  # fmt: skip
            if task.config:
                near = str(Decimal(answer) + Decimal("0.05"))
                default = reasoning_gym.get_score_answer_fn(task.name)
                assert (task.reference.score_answer(near, entry), default(near, entry)) == (1, 0)
                responses.append(near)
            for k, response in enumerate(responses):
                item = reward_item(record, f"{record.prompt_id}/{k}", response)
                items.append(item.model_dump(mode="json", exclude_unset=True))
                scored = _scored_answer(response)
                try:
                    expected.append((float(task.reference.score_answer(scored, entry)), None))
                except Exception as e:
                    expected.append((0.0, type(e).__name__))
    results = reward.verify(*items, timeout=300)  # one request, every item
    assert len(results) == len(items)
    raised: set[str] = set()
    for item, result, (score, error) in zip(items, results, expected, strict=True):
        where = (item["id"], item["response"][:60], result)
        assert result["id"] == item["id"]
        if error is None:
            assert result["score"] == score, where
            assert result["reason"] != "scorer_error", where
            assert result["correct"] == (score >= 1.0), where
        else:
            raised.add(item["data_source"])
            assert (result["score"], result["reason"]) == (0.0, "scorer_error"), where
            assert f"score_answer raised {error}" in result["detail"], where
    # What a new user of 0.1.25 meets: five tasks' own answers score 0 (they have none), and
    # prime_factorization's scorer raises on a response that is not a product of numbers.
    assert {t.name for t in tasks if t.entries[0]["answer"] is None} == NO_ANSWER
    for item, result in zip(items, results, strict=True):
        task = item["data_source"].removeprefix("reasoning_gym/")
        if task in NO_ANSWER and item["id"].endswith("/0"):
            assert result["score"] == 0.0, result
    assert "reasoning_gym/prime_factorization" in raised
    assert all(r["reason"] != "timeout" for r in results)


def test_the_command_mixes_tasks_by_weight_and_names_what_it_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mix.parquet"
    argv = ["reasoning-gym", "--tasks", "chain_sum,graph_color,arc_agi", "--weights", "6,1,1",
            "--size", "40", "--seed", "5", "--config", "chain_sum.min_terms=3",
            "--out", str(out)]  # fmt: skip
    assert data_main(argv) == 0
    rows = load_records(out)
    sources = [r.data_source for r in rows]
    assert set(sources) == {f"reasoning_gym/{t}" for t in ("chain_sum", "graph_color", "arc_agi")}
    assert sources.count("reasoning_gym/chain_sum") > len(rows) / 2  # weight 6 of 8
    # The library's own mixer with the same arguments gives the same entries, in order.
    mixed = reasoning_gym.create_dataset("composite", size=40, seed=5, datasets=[
        DatasetSpec("chain_sum", 6.0, {"min_terms": 3}), DatasetSpec("graph_color", 1.0, {}),
        DatasetSpec("arc_agi", 1.0, {})])  # fmt: skip
    for i, record in enumerate(rows):
        assert record.prompt[-1]["content"] == mixed[i]["question"]
        assert record.prompt[0]["role"] == "system" and "<answer>" in record.prompt[0]["content"]
        kept = record.reward_extra
        assert kept["config"] == ({"min_terms": 3} if "chain_sum" in record.data_source else {})
        _same(mixed[i], rg_entry.decode_entry(kept["entry"]))
    assert "40 rows ->" in capsys.readouterr().out

    def refused(*args: str) -> str:
        assert data_main(["reasoning-gym", *args, "--out", str(tmp_path / "x.jsonl")]) == 2
        return capsys.readouterr().err

    err = refused("--tasks", "chain_sum,graph_colour", "--size", "2")
    assert "unknown task 'graph_colour' (did you mean graph_color?)" in err
    assert "zebra_puzzles" in err  # the known tasks are listed
    assert "'composite' is reasoning-gym's mixer" in refused("--tasks", "composite", "--size", "2")
    err = refused("--tasks", "chain_sum", "--size", "2", "--config", "chain_sum.colour=3")
    assert "--config chain_sum.colour=3: chain_sum has no option 'colour'; its options: " in err
    err = refused("--tasks", "chain_sum", "--size", "2", "--config", "chain_sum.min_terms=0")
    assert "--config chain_sum.min_terms=0: reasoning-gym refused the options of chain_sum: " in err
    err = refused("--tasks", "chain_sum", "--size", "2", "--config", "gcd.min_value=1")
    assert "--config gcd.min_value=1: 'gcd' is not one of --tasks (chain_sum)" in err
    assert "--weights: 1 weights for 2 tasks" in refused(
        "--tasks", "chain_sum,gcd", "--weights", "1", "--size", "2")  # fmt: skip
    assert not (tmp_path / "x.jsonl").exists()


def test_the_data_check_refuses_a_reasoning_gym_source_with_an_unknown_task(
    tmp_path: Path,
) -> None:
    row = {"id": "a", "data_source": "reasoning_gym/chain_sums", "ability": "reasoning_gym",
           "prompt": [{"role": "user", "content": "1 + 1 ="}],
           "reward_model": {"ground_truth": "2"},
           "extra_info": {"reasoning_gym": json.dumps({"task": "chain_sums", "config": {},
                          "entry": {"question": "1 + 1 =", "answer": "2", "metadata": {}}})}}  # fmt: skip
    data = write_rows([row], tmp_path / "bad.jsonl")
    cfg = load_config(None, [f"rollout.dataset={data}"], env={})
    with pytest.raises(ValueError) as err:
        check_routes(load_records(data), cfg)
    message = str(err.value)
    assert (
        "no reasoning-gym task for data_source 'reasoning_gym/chain_sums' (reasoning_gym)"
        in message
    )
    assert "the form is reasoning_gym/<task>, <task> one of reasoning-gym 0.1.25's: ab, " in message
    # A '*' route does not make an unknown task scoreable: still refused.
    cfg = load_config(None, [f"rollout.dataset={data}", "reward.routes.*={kind: math}"], env={})
    with pytest.raises(ValueError, match="reasoning_gym/chain_sums"):
        check_routes(load_records(data), cfg)
