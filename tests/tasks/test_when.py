"""The when-to-call task (``tasks.when``): its tiers, the warm start's half-and-half
demonstrations, the two-call demonstrations, and the print sandbox the code demonstrations use
against the reward service's real ``/run_code``."""

from __future__ import annotations

import asyncio
import re

import pytest

from dynamo_rl.config import load_config
from dynamo_rl.envs import EnvContext, make_env
from services.rollout.eval_cli import tier_episodes
from tasks.when import PrintSandbox, calling_rows, demos, generate_rows
from tests.conftest import REPO
from tests.dynamo_rl.test_envs import sandbox_url  # noqa: F401 - a reward service's fixture


def test_rows_mix_the_tiers_in_turn_with_their_answers() -> None:
    train, test = generate_rows(300, 100, seed=1, tiers=("easy", "hard", "two_calls"))
    assert len(train) == 300 and len(test) == 100
    questions = set()
    for i, row in enumerate(test + train):
        q = row["prompt"][0]["content"]
        questions.add(q)
        tier = row["extra_info"]["tier"]
        assert tier == ("easy", "hard", "two_calls")[i % 3]
        value = int(row["reward_model"]["ground_truth"])
        if tier == "easy":  # the same length as hard, each answer digit a sum of two
            a, b = q.removesuffix("=").split("+")
            assert (len(a), len(b), int(a) + int(b)) == (4, 3, value)
            assert str(value) == a[0] + "".join(
                str(int(x) + int(y)) for x, y in zip(a[1:], b, strict=True)
            )
        elif tier == "hard":
            a, b = q.removesuffix("=").split("*")
            assert (len(a), len(b), len(str(value)), int(a) * int(b)) == (4, 3, 7, value)
        else:
            a, b, c, d = map(int, re.findall(r"\d+", q))
            assert a * b + c * d == value
        assert row["extra_info"]["answer"] == f"\\boxed{{{value}}}"
    assert len(questions) == 400  # train and test share no question
    assert generate_rows(20, 5, seed=3) == generate_rows(20, 5, seed=3)
    assert generate_rows(20, 5, seed=3) != generate_rows(20, 5, seed=4)
    with pytest.raises(ValueError, match=r"up\.task_tiers: unknown tier 'huge'"):
        generate_rows(4, 2, tiers=("easy", "huge"))


def test_the_task_tiers_setting_names_the_allowed_values() -> None:
    from dynamo_rl.config.base import ConfigError

    with pytest.raises(ConfigError, match=r"up\.task_tiers\.1: Input should be 'easy', 'hard' or"):
        load_config(str(REPO / "configs" / "agent_when.yaml"), ["up.task_tiers=[easy,huge]"])
    with pytest.raises(ConfigError, match=r"up\.task_tiers: each of easy, hard, two_calls at most"):
        load_config(str(REPO / "configs" / "agent_when.yaml"), ["up.task_tiers=[easy,easy]"])


@pytest.fixture(scope="module")
def when_cfg():
    return load_config(str(REPO / "configs" / "agent_when.yaml"))


def test_half_the_demonstrations_call_whatever_the_tier(when_cfg) -> None:
    """Exactly n // 2 questions call, drawn by seed, about half of each tier."""
    train, _ = generate_rows(400, 1, seed=0)
    calling = calling_rows(len(train), "half_tool_calls", seed=5)
    assert len(calling) == 200
    assert calling == calling_rows(len(train), "half_tool_calls", seed=5)
    assert calling != calling_rows(len(train), "half_tool_calls", seed=6)
    for tier in ("easy", "hard"):
        mine = [i for i, r in enumerate(train) if r["extra_info"]["tier"] == tier]
        share = sum(i in calling for i in mine) / len(mine)
        assert 0.4 <= share <= 0.6, (tier, share)
    assert calling_rows(10, "tool_calls", 0) == set(range(10))
    assert calling_rows(10, "answers", 0) == set()
    rows = train[:40]
    made = demos(rows, when_cfg.rollout.env, "half_tool_calls", seed=5)
    picked = calling_rows(40, "half_tool_calls", seed=5)
    by_question: dict[str, list[dict]] = {}
    for r in made:
        by_question.setdefault(r["reward_model"]["ground_truth"] + r["prompt"][:40], []).append(r)
    calls = [r for r in made if r["extra_info"]["answer"].startswith("<tool_call>")]
    assert len(calls) == len(picked) == 20
    assert len(made) == 2 * 20 + 20  # a calling question has 2 rows, a direct one 1
    for i, row in enumerate(rows):
        q = row["prompt"][0]["content"]
        mine = [r for r in made if r["prompt"].split("\n")[1].startswith(q)]
        assert all(r["extra_info"]["called"] == (i in picked) for r in mine)
        if i in picked:
            assert len(mine) == 2 and q.removesuffix("=") in mine[0]["extra_info"]["answer"]
            assert mine[1]["prompt"].endswith("\n" + row["reward_model"]["ground_truth"])
        else:
            assert len(mine) == 1 and mine[0]["prompt"].endswith(q)
        assert mine[-1]["extra_info"]["answer"] == row["extra_info"]["answer"]


def test_two_call_questions_are_demonstrated_with_two_calls() -> None:
    cfg = load_config(str(REPO / "configs" / "agent_code.yaml"))
    train, _ = generate_rows(2, 1, seed=0, tiers=("two_calls",))
    made = demos(train[:1], cfg.rollout.env, "tool_calls")
    a, b, c, d = map(int, re.findall(r"\d+", train[0]["prompt"][0]["content"]))
    assert [r["extra_info"]["answer"] for r in made] == [
        f"```python\nprint({a}*{b})\n```",
        f"```python\nprint({a * b}+{c}*{d})\n```",
        f"\\boxed{{{a * b + c * d}}}",
    ]
    assert made[2]["prompt"].endswith(f"\n{a * b + c * d}\n")


def test_tier_episodes_gives_each_tiers_call_rate() -> None:
    stats = [
        {"tier": "easy", "turns": 1, "tool_calls": 0, "tool_errors": 0, "dropped": False},
        {"tier": "easy", "turns": 2, "tool_calls": 1, "tool_errors": 0, "dropped": False},
        {"tier": "hard", "turns": 2, "tool_calls": 1, "tool_errors": 1, "dropped": False},
    ]
    assert tier_episodes(stats, "easy", "tools")["episodes"]["tool_call_rate"] == 0.5
    hard = tier_episodes(stats, "hard", "tools")["episodes"]
    assert (hard["tool_call_rate"], hard["tool_error_rate"], hard["episodes"]) == (1.0, 1.0, 1)
    assert tier_episodes(stats, "two_calls", "tools") == {}


@pytest.mark.slow
def test_print_sandbox_prints_what_run_code_prints(sandbox_url: str) -> None:  # noqa: F811
    """The code demonstrations' observations are the real sandbox's."""
    from dynamo_rl.envs.sandbox import SandboxClient

    cfg = load_config(str(REPO / "configs" / "agent_code.yaml")).rollout.env

    async def observe(sandbox) -> list[list[dict]]:
        out = []
        for cell in ("print(8808*466)", "print(8721+616*46)"):
            env = make_env(EnvContext(cfg, sandbox, seed=0))
            await env.reset({"prompt": "x"})
            out.append((await env.step(f"```python\n{cell}\n```")).observation)
        await sandbox.aclose()
        return out

    real = asyncio.run(observe(SandboxClient(sandbox_url)))
    assert real == asyncio.run(observe(PrintSandbox()))
    assert real[0] == [{"role": "tool", "content": f"{8808 * 466}\n"}]
