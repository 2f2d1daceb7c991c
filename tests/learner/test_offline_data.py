"""Offline data of the sft/dpo modes: layouts, dotted keys, filters, visiting order, errors; and
the arith preference-pair generator."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dynamo_rl.config import LearnerConfig
from dynamo_rl.prompts import render_plain
from learner.offline_data import DataError, DataOrder, check_data_paths, load_examples, read_rows
from learner.tiny_model import build_char_tokenizer
from tasks.arith import generate_rows, preference_rows, write_preferences, wrong_answer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def data_cfg(**kw):
    return LearnerConfig(mode="sft", data={"path": "x", **kw}).data


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_verl_parquet_response_from_dotted_key_with_tier_filter(tok, tmp_path: Path) -> None:
    train, _ = generate_rows(60, 10, seed=1)
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(train), path)
    cfg = data_cfg(filter_key="extra_info.tier", filter_values=["easy", "medium"])
    examples = load_examples(path, tok, cfg, "sft")
    kept = [r for r in train if r["extra_info"]["tier"] in ("easy", "medium")]
    assert 0 < len(examples) == len(kept) < len(train)
    for ex, row in zip(examples, kept, strict=True):
        # Exactly what the rollout worker sends, then the reference answer and EOS.
        assert tok.decode(ex.prompt) == render_plain(row["prompt"])
        assert tok.decode(ex.prompt).endswith("\nAssistant:")
        assert ex.response[-1] == tok.eos_token_id
        assert tok.decode(ex.response[:-1]) == row["extra_info"]["answer"]


def test_prompt_response_text_and_chat_messages(tok, tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "Q: 1+1\nA:", "response": " 2"},
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                ]
            },
        ],
    )
    a, b = load_examples(path, tok, data_cfg(), "sft")
    assert tok.decode(a.prompt) == "Q: 1+1\nA:" and tok.decode(a.response[:-1]) == " 2"
    assert tok.decode(b.prompt) == "User: hi\nAssistant:" and tok.decode(b.response[:-1]) == "yo"
    custom = write_jsonl(tmp_path / "c.jsonl", [{"q": "x", "out": {"text": "y"}}])
    (c,) = load_examples(custom, tok, data_cfg(prompt_key="q", response_key="out.text"), "sft")
    assert tok.decode(c.prompt) == "x" and tok.decode(c.response[:-1]) == "y"


def test_preference_pairs_strings_and_trl_conversational(tok, tmp_path: Path) -> None:
    conv = [{"role": "user", "content": "2+2="}]
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"prompt": conv, "chosen": "\\boxed{4}", "rejected": "\\boxed{5}"},
            {
                "chosen": [*conv, {"role": "assistant", "content": "4"}],
                "rejected": [*conv, {"role": "assistant", "content": "5"}],
            },
        ],
    )
    a, b = load_examples(path, tok, data_cfg(), "dpo")
    assert tok.decode(a.prompt) == tok.decode(b.prompt) == "User: 2+2=\nAssistant:"
    assert tok.decode(a.chosen[:-1]) == "\\boxed{4}" and tok.decode(a.rejected[:-1]) == "\\boxed{5}"
    assert tok.decode(b.chosen[:-1]) == "4" and b.rejected[-1] == tok.eos_token_id


def test_errors_name_the_config_key(tok, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "answer": "a"}])
    with pytest.raises(DataError, match=r"response_key.*fields: \['answer', 'prompt'\]"):
        load_examples(path, tok, data_cfg(), "sft")
    with pytest.raises(DataError, match=r"learner.data.chosen_key"):
        load_examples(path, tok, data_cfg(), "dpo")
    with pytest.raises(DataError, match=r"learner.data.path: no rows.*filter_key"):
        load_examples(path, tok, data_cfg(filter_key="tier", filter_values=["x"]), "sft")
    with pytest.raises(DataError, match=r"learner.data.path: no such file"):
        read_rows(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(DataError, match="line 1 is not JSON"):
        read_rows(bad)
    msg = check_data_paths(SimpleNamespace(path=str(path), eval_path=str(tmp_path / "nope")))
    assert msg is not None and msg.startswith("learner.data.eval_path: no such file")
    with pytest.raises(ValueError, match=r"learner.data.path: required in learner.mode 'dpo'"):
        LearnerConfig(mode="dpo")


def test_data_order_is_a_permutation_per_epoch_and_resumable() -> None:
    order = DataOrder(10, seed=3)
    batches = [order.batch(p, 4) for p in range(0, 40, 4)]  # 4 epochs, crossing boundaries
    flat = [i for b in batches for i in b]
    for e in range(4):
        assert sorted(flat[e * 10 : (e + 1) * 10]) == list(range(10))
    assert flat[:10] != flat[10:20]  # a new order each epoch
    # A fresh order (a restarted run) at the same position gives the same batch.
    assert DataOrder(10, seed=3).batch(12, 4) == batches[3]
    assert DataOrder(10, seed=3, shuffle=False).batch(8, 4) == [8, 9, 0, 1]


def test_arith_preference_pairs(tmp_path: Path) -> None:
    import random

    rng = random.Random(0)
    for value in (0, 7, 45, 99, 1234, -8):
        for kind in ("random", "units"):
            for _ in range(50):
                w = wrong_answer(value, rng, kind)
                assert w != value and len(str(abs(w))) == len(str(abs(value)))
                assert (w < 0) == (value < 0)
                if kind == "units":
                    assert abs(w) // 10 == abs(value) // 10
    train, _ = generate_rows(30, 5)
    pairs = preference_rows(train, pairs_per_prompt=3)
    assert len(pairs) == 90
    for p in pairs:
        assert p["chosen"] == p["extra_info"]["answer"] != p["rejected"]
    paths = write_preferences(tmp_path, 40, 20, tiers=["easy", "medium"])
    test_rows = read_rows(paths["test"])
    train_prompts = {json.dumps(r["prompt"]) for r in read_rows(paths["train"])}
    assert test_rows and all(r["extra_info"]["tier"] in ("easy", "medium") for r in test_rows)
    assert not train_prompts & {json.dumps(r["prompt"]) for r in test_rows}  # held out
