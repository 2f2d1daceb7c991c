"""Prompt datasets: JSONL and verl parquet rows, prompt ids, templates, batching."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from learner.tiny_model import build_char_tokenizer
from services.rollout.datasets import (
    DatasetError,
    PromptRenderer,
    PromptSampler,
    load_records,
    record_from_row,
    reward_item,
)

VERL_ROWS = [
    {
        "data_source": "arith",
        "prompt": [{"role": "user", "content": f"{i}+1="}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {"index": i, "split": "train"},
    }
    for i in range(5)
]


def test_verl_parquet_layout(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(VERL_ROWS), path)
    records = load_records(path)
    assert [r.prompt_id for r in records] == [f"arith-{i}" for i in range(5)]
    r = records[3]
    assert r.prompt == [{"role": "user", "content": "3+1="}]
    assert (r.ground_truth, r.data_source, r.kind) == ("4", "arith", "math")


def test_jsonl_flat_rows_and_code_rows(tmp_path: Path) -> None:
    tests = {"type": "stdio", "cases": [{"stdin": "1", "stdout": "2"}]}
    rows = [
        {"id": "q1", "prompt": "What is 2+2?", "answer": "4"},
        {"prompt": "Add one.", "kind": "code", "tests": tests, "data_source": "code"},
        {"prompt": [{"role": "user", "content": "x"}], "ground_truth": "y"},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    a, b, c = load_records(path)
    assert (a.prompt_id, a.prompt, a.ground_truth) == ("q1", "What is 2+2?", "4")
    assert b.prompt_id == "code-1" and b.kind == "code"
    assert b.reward_extra == {"tests": tests, "language": "python"}
    assert c.prompt_id == "data-2"
    verl_code = {
        "prompt": "p",
        "ability": "code",
        "reward_model": {"ground_truth": '{"type": "assert", "code": "assert f()"}'},
    }
    code = record_from_row(verl_code, 0)
    assert code.kind == "code" and code.reward_extra["tests"] == {
        "type": "assert",
        "code": "assert f()",
    }
    assert record_from_row({"prompt": "p", "ability": "reasoning", "answer": "1"}, 0).kind == "math"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"answer": "1"}, "row 0: missing field 'prompt'"),
        ({"prompt": "q"}, "reward_model.ground_truth"),
        ({"prompt": [{"role": "user"}], "answer": "1"}, "prompt[0]"),
        (
            {"prompt": "q", "answer": "1", "kind": "poem"},
            "kind must be one of math, code, model, judge",
        ),
        ({"prompt": "q", "kind": "code"}, "code rows need 'tests'"),
    ],
)
def test_bad_rows_name_the_row_and_field(row: dict, message: str) -> None:
    with pytest.raises(DatasetError, match=message.replace("[", r"\[").replace("]", r"\]")):
        record_from_row(row, 0)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        load_records(tmp_path / "missing.jsonl")
    odd = tmp_path / "d.txt"
    odd.write_text("{}")
    with pytest.raises(DatasetError, match="dataset_format"):
        load_records(odd)
    dup = tmp_path / "dup.jsonl"
    dup.write_text(
        '{"id": 1, "prompt": "a", "answer": "1"}\n{"id": 1, "prompt": "b", "answer": "2"}\n'
    )
    with pytest.raises(DatasetError, match="share the prompt id '1'"):
        load_records(dup)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a", "answer": "1"}\n{not json\n')
    with pytest.raises(DatasetError, match="line 2"):
        load_records(broken)


def test_plain_template_without_a_chat_template() -> None:
    tok = build_char_tokenizer()
    assert not getattr(tok, "chat_template", None)
    renderer = PromptRenderer(tok, "auto")
    text, ids = renderer.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="}]
    )
    assert text == "System: Be brief.\nUser: 2+2=\nAssistant:"
    assert tok.decode(ids) == text
    assert renderer.render("raw 1+1=")[0] == "raw 1+1="
    with pytest.raises(ValueError, match="no chat template"):
        PromptRenderer(tok, "chat")


def test_tokenizer_chat_template_is_used_when_present() -> None:
    tok = build_char_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    text, ids = PromptRenderer(tok, "auto").render([{"role": "user", "content": "3*3="}])
    assert text == "<|user|>3*3=\n<|assistant|>"
    assert tok.decode(ids) == text
    # 'plain' overrides the tokenizer's template.
    assert PromptRenderer(tok, "plain").render([{"role": "user", "content": "a"}])[0] == (
        "User: a\nAssistant:"
    )


def test_sampler_covers_each_epoch_shards_and_never_repeats_in_a_batch() -> None:
    records = [record_from_row({"id": i, "prompt": "q", "answer": "a"}, i) for i in range(10)]
    sampler = PromptSampler(records, shuffle=True, seed=1)
    epoch = [r.prompt_id for _ in range(5) for r in sampler.next_batch(2)]
    assert sorted(epoch) == sorted(str(i) for i in range(10))
    assert epoch != [str(i) for i in range(10)]  # shuffled
    served: list[str] = []
    for _ in range(10):
        batch = sampler.next_batch(3)  # 10 is not a multiple of 3: batches straddle epochs
        assert len({r.prompt_id for r in batch}) == 3
        served += [r.prompt_id for r in batch]
    # 30 draws are exactly three more epochs: every prompt served three times, none dropped.
    assert sorted(served) == sorted(str(i) for i in range(10) for _ in range(3))
    shards = [PromptSampler(records, num_shards=3, shard=k).records for k in range(3)]
    ids = [r.prompt_id for shard in shards for r in shard]
    assert sorted(ids) == sorted(str(i) for i in range(10))
    assert len(PromptSampler(records[:2], shuffle=False).next_batch(5)) == 2
    with pytest.raises(DatasetError, match="shard 3 of 4 holds no prompts"):
        PromptSampler(records[:3], num_shards=4, shard=3)


def test_reward_items_carry_data_source_prompt_and_length() -> None:
    """What composite reward specs route and measure by; judge/model rows need no answer."""
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    math = record_from_row({"prompt": chat, "answer": "4", "data_source": "gsm"}, 0)
    assert reward_item(math, "a", "4", response_length=3).model_dump(exclude_unset=True) == {
        "id": "a", "kind": "math", "response": "4", "data_source": "gsm", "prompt": "2+2?",
        "ground_truth": "4", "response_length": 3,
    }  # fmt: skip
    judged = record_from_row({"prompt": "Write a haiku", "kind": "judge", "data_source": "p"}, 1)
    item = reward_item(judged, "b", "...").model_dump(exclude_unset=True)
    assert item["kind"] == "judge" and "reference" not in item and "response_length" not in item
    ref = record_from_row({"prompt": "q", "kind": "judge", "answer": "r"}, 2)
    assert reward_item(ref, "c", "x").reference == "r"
    assert reward_item(record_from_row({"prompt": "q", "kind": "model"}, 3), "d", "x").prompt == "q"


def test_code_tests_are_checked_against_the_contract_at_load() -> None:
    """A malformed case is the row's fault, named at load, not a refused request mid-run."""
    bad = {"type": "stdio", "cases": [{"stdin": "1"}]}
    with pytest.raises(DatasetError, match=r"row 4: code item field 'tests\.cases\.0\.stdout'"):
        record_from_row({"prompt": "q", "kind": "code", "tests": bad}, 4)
    with pytest.raises(DatasetError, match="'language'"):
        record_from_row({"prompt": "q", "kind": "code", "language": "rust",
                         "tests": {"type": "assert", "code": "assert 1"}}, 0)  # fmt: skip
    verl = {"inputs": ["1\n", ["2", "3"]], "outputs": ["2\n", "5"]}
    record = record_from_row({"prompt": "q", "ability": "code",
                              "reward_model": {"ground_truth": json.dumps(verl)}}, 0)  # fmt: skip
    assert record.reward_extra["tests"] == {
        "type": "stdio",
        "cases": [{"stdin": "1\n", "stdout": "2\n"}, {"stdin": "2\n3", "stdout": "5"}],
    }


def test_a_rows_tier_is_kept_for_per_tier_evaluations() -> None:
    from tasks.arith import generate_rows

    row = generate_rows(20, 5, seed=0)[1][0]  # a test row of the built-in task
    assert record_from_row(row, 0).tier == row["extra_info"]["tier"]
    flat = {"prompt": "1+1=", "ground_truth": "2", "tier": "easy"}
    assert record_from_row(flat, 0).tier == "easy"
    assert record_from_row({"prompt": "1+1=", "ground_truth": "2"}, 0).tier is None
