"""The agent recipe's ``products`` task and its tool-using demonstrations: the demonstrations'
token ids are exactly those the rollout loop builds for the same turns (so the warm start and RL
train the same sequences)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dynamo_rl.config import load_config
from dynamo_rl.envs import EnvContext, make_env
from learner.offline_data import Encoder
from learner.tiny_model import EOS, build_char_tokenizer
from services.rollout.episodes import Conversation
from tasks.products import EOS_TEXT, generate_rows, tool_demos
from tests.conftest import REPO


def test_rows_are_multi_digit_products_in_verl_layout() -> None:
    train, test = generate_rows(300, 100, seed=1)
    assert len(train) == 300 and len(test) == 100
    questions = set()
    for row in train + test:
        q = row["prompt"][0]["content"]
        questions.add(q)
        a, b = q.removesuffix("=").split("*")
        assert row["data_source"] == "products" and row["prompt"][0]["role"] == "user"
        assert str(int(a) * int(b)) == row["reward_model"]["ground_truth"]
        assert row["extra_info"]["tier"] == f"{len(a)}x{len(b)}"
        assert (len(a), len(b), len(row["reward_model"]["ground_truth"])) == (4, 3, 7)
        assert row["extra_info"]["answer"] == "\\boxed{" + row["reward_model"]["ground_truth"] + "}"
    assert len(questions) == 400  # train and test share no question
    assert generate_rows(20, 5, seed=3) == generate_rows(20, 5, seed=3)
    assert generate_rows(20, 5, seed=3) != generate_rows(20, 5, seed=4)


@pytest.fixture(scope="module")
def env_cfg():
    return load_config(str(REPO / "configs" / "agent_tools.yaml")).rollout.env


def test_demonstrations_are_the_rollout_loops_token_ids(env_cfg) -> None:
    assert EOS_TEXT == EOS  # the tiny tokenizer reads the text back as its end token
    tok = build_char_tokenizer()
    conv = Conversation(tok, "raw")
    enc = Encoder(tok, "raw")
    train, _ = generate_rows(6, 1, seed=2)
    demos = tool_demos(train, env_cfg)
    assert len(demos) == 2 * len(train)
    for row, call_row, answer_row in zip(train, demos[::2], demos[1::2], strict=True):
        call = call_row["extra_info"]["answer"]
        # What run_episode keeps: the first prompt, the sampled turn (its end token included),
        # then the observation as the template renders it after the turn.
        env = make_env(EnvContext(env_cfg, None, seed=0))
        messages = asyncio.run(env.reset(row))
        kept = conv.text(messages)
        prompt = conv.prompt_ids(kept)
        turn = [*tok.encode(call, add_special_tokens=False), tok.eos_token_id]
        kept += conv.decode(turn)
        step = asyncio.run(env.step(call))
        assert not step.done and step.observation == [
            {"role": "tool", "content": row["reward_model"]["ground_truth"]}
        ]
        text = conv.text([*messages, {"role": "assistant", "content": call}, *step.observation])
        assert text.startswith(kept)
        episode = prompt + turn + conv.piece_ids(text[len(kept) :])
        assert enc.prompt(call_row["prompt"], "prompt") == prompt
        assert enc.response(call) == turn  # the call, then the end token, as sampled
        assert enc.prompt(answer_row["prompt"], "prompt") == episode
        assert answer_row["extra_info"]["answer"] == row["extra_info"]["answer"]


def test_demonstrations_need_a_tools_environment_that_runs_the_call(env_cfg) -> None:
    train, _ = generate_rows(1, 1, seed=0)
    other = env_cfg.model_copy(update={"tools": []})  # no calculator: the call is refused
    with pytest.raises(ValueError, match="did not run"):
        tool_demos(train, other)


def test_up_writes_the_products_task_and_its_demonstrations(tmp_path: Path) -> None:
    from launcher.up import Launcher

    cfg = load_config(
        str(REPO / "configs" / "agent_tools.yaml"),
        [f"run.dir={tmp_path}", "up.task_train=40", "up.task_test=10", "up.warm_start.rows=7"],
    )
    launcher = Launcher(cfg)
    dataset, test = launcher.prepare_data()
    assert Path(dataset).name == "train.parquet" and Path(str(test)).name == "test.parquet"
    import pyarrow.parquet as pq

    assert pq.read_table(dataset).num_rows == 40
    assert {r["data_source"] for r in pq.read_table(dataset).to_pylist()} == {"products"}


@pytest.mark.slow
def test_products_warm_start_is_checked_on_unseen_questions_and_extended(tmp_path: Path) -> None:
    """A warm start too short to learn the copy is checked on demonstrations of train questions
    it never saw, extended, checked again, then refused with an error."""
    import io

    from launcher.up import Launcher

    overrides = [
        f"run.dir={tmp_path}", "up.task_train=60", "up.task_test=5", "up.warm_start.rows=20",
        "up.warm_start.check_rows=4", "up.warm_start.steps=3", "up.warm_start.extend_steps=2",
        "up.warm_start.max_extensions=1", "up.warm_start.batch_size=4",
        "up.tiny_model.hidden_size=32", "up.tiny_model.num_layers=1",
    ]  # fmt: skip
    out = io.StringIO()
    launcher = Launcher(load_config(str(REPO / "configs" / "agent_tools.yaml"), overrides), out)
    dataset, _test = launcher.prepare_data()
    with pytest.raises(RuntimeError, match="after 5 steps and 1 extensions"):
        launcher.prepare_model(dataset)
    log = out.getvalue()
    assert log.count("warm start checked (greedy exact match on 8 rows") == 2
    assert "warm start extended (below 0.5): 5 steps" in log
    import pyarrow.parquet as pq

    train = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    seen = {r["prompt"][0]["content"] for r in train[:20]}
    check = pq.read_table(tmp_path / "data" / "warm_check.parquet").to_pylist()
    assert len(check) == 8 and not any(r["prompt"].split("\n")[1].split("<")[0] in seen
                                       for r in check)  # fmt: skip
