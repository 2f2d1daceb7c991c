"""The built-in environments, the tool-call parsers and the sandbox client — the code
interpreter against a real reward service's ``/run_code`` (bwrap sandbox)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from dynamo_rl.config import ConfigError, load_config
from dynamo_rl.config.rollout import EnvConfig
from dynamo_rl.envs import EnvContext, EnvUnavailable, check_env_config, make_env
from dynamo_rl.envs.builtin import truncate
from dynamo_rl.envs.parsers import TOOL_PARSERS, parse_code_blocks
from dynamo_rl.envs.sandbox import SandboxClient
from dynamo_rl.procs import free_port
from dynamo_rl.service_table import SERVICES
from tests.conftest import REPO, dynamo_rl_argv

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "evaluate arithmetic",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}


def env_of(sandbox: Any = None, **kw: Any) -> Any:
    return make_env(EnvContext(EnvConfig(**kw), sandbox, seed=3))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_hermes_parser_calls_and_malformed() -> None:
    p = TOOL_PARSERS["hermes"]
    ok = p('x <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>')
    assert [(c.name, c.arguments) for c in ok.calls] == [("calculator", {"expression": "2*3"})]
    assert not ok.malformed
    # Qwen sometimes writes the arguments as a JSON string.
    s = p('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert s.calls[0].arguments == {"a": 1}
    bad = p('<tool_call>{not json}</tool_call> <tool_call>[1]</tool_call> <tool_call>{"name"')
    assert not bad.calls and len(bad.malformed) == 3
    assert "not JSON" in bad.malformed[0] and "unclosed" in bad.malformed[2]
    assert not p("no call here").calls and not p("no call here").malformed


def test_code_block_parser() -> None:
    got = parse_code_blocks("a\n```python\nprint(1)\n```\nb ```py\nx=2\n```\n```python\nopen")
    assert [c.arguments["code"] for c in got.calls] == ["print(1)\n", "x=2\n"]
    assert got.malformed == ["unclosed ```python block"]


def test_truncate_keeps_head_and_tail_within_budget() -> None:
    text = "".join(chr(65 + i % 26) for i in range(500))
    cut = truncate(text, 100)
    assert len(cut) <= 100 and cut.startswith(text[:10]) and cut.endswith(text[-10:])
    assert "truncated" in cut and truncate("short", 100) == "short"


def test_guess_number_needs_several_turns() -> None:
    env = env_of(name="guess_number", guess_low=1, guess_high=100)
    first = run(env.reset({"prompt": "", "ground_truth": "42"}))
    assert "between 1 and 100" in first[0]["content"]
    obs, reward, done, _ = run(env.step("I guess 50"))
    assert "lower" in obs[0]["content"] and reward == 0.0 and not done
    obs, _, done, _ = run(env.step("hmm"))
    assert "one number" in obs[0]["content"] and not done
    obs, _, done, _ = run(env.step("30"))
    assert "higher" in obs[0]["content"]
    obs, reward, done, info = run(env.step("42"))
    assert (obs, reward, done, info["guess"]) == ([], 1.0, True, 42)


def test_tools_env_calls_and_errors_never_raise() -> None:
    env = env_of(name="tools", tools=[CALC])
    msgs = run(env.reset({"prompt": "what is 12*34?"}))
    assert msgs[0]["role"] == "system" and "calculator" in msgs[0]["content"]
    obs, _, done, info = run(env.step(
        '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"x": 1}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(1)"}}'
        "</tool_call><tool_call>{oops}</tool_call>"
    ))  # fmt: skip
    assert not done
    contents = [o["content"] for o in obs]
    calls = info["tool_calls"]
    assert contents[0].startswith("error: malformed") and calls[0].malformed
    assert contents[1] == "408" and calls[1].error == ""
    assert "unknown tool 'nope'" in contents[2]
    assert "missing required argument" in contents[3] and calls[3].error.startswith("bad")
    assert contents[4].startswith("error: not arithmetic") and calls[4].error == "failed"
    _, _, done, _ = run(env.step("The answer is 408."))
    assert done


def test_env_config_errors_name_field_and_allowed_values() -> None:
    # The registries are checked where environments are built (check_env_config), not by the
    # config, which imports no environment.
    with pytest.raises(ValueError, match=r"rollout\.env\.name.*code_interpreter"):
        check_env_config(load_config(None, ["rollout.env.name=chess"], env={}).rollout.env)
    with pytest.raises(ValueError, match=r"rollout\.env\.tool_parser.*hermes"):
        check_env_config(load_config(None, ["rollout.env.tool_parser=nope"], env={}).rollout.env)
    with pytest.raises(ValueError, match=r"tools\[0\].*allowed: \['calculator', 'python'\]"):
        bad = json.dumps([{"type": "function", "function": {"name": "rm"}}])
        check_env_config(load_config(None, [f"rollout.env.tools={bad}"], env={}).rollout.env)
    with pytest.raises(ValueError, match=r"rollout\.env\.import_module 'no_such_module'"):
        check_env_config(EnvConfig(import_module="no_such_module"))
    # What needs no registry stays the config's own check.
    with pytest.raises(ConfigError, match=r"rollout\.env\.tools\[0\] must be"):
        load_config(None, ['rollout.env.tools=[{"type": "tool"}]'], env={})
    with pytest.raises(ConfigError, match=r"rollout\.env\.guess_low"):
        load_config(None, ["rollout.env.guess_low=5", "rollout.env.guess_high=4"], env={})
    with pytest.raises(ConfigError, match=r"rollout\.env\.max_turns"):
        load_config(None, ["rollout.env.max_turns=0"], env={})
    with pytest.raises(ConfigError, match=r"rollout\.env\.colour"):
        load_config(None, ["rollout.env.colour=1"], env={})
    assert load_config(None, [], env={}).rollout.env.name == "single_turn"
    check_env_config(EnvConfig(name="tools", tools=[CALC]))


def test_the_config_imports_no_environment() -> None:
    """No import cycle between the config and the environments, lazy or not: the config loads,
    validates and checks env settings without importing dynamo_rl.envs."""
    code = (
        "import sys\nfrom dynamo_rl.config import load_config\n"
        "load_config(None, ['rollout.env.name=guess_number', 'rollout.env.tool_parser=x'], env={})\n"
        "assert 'dynamo_rl.envs' not in sys.modules, 'the config imported dynamo_rl.envs'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize("command", [["rollout"], ["eval", "--data", "x.jsonl"]])
def test_an_unknown_environment_is_refused_by_the_commands_that_build_environments(
    command: list[str],
) -> None:
    result = subprocess.run(
        dynamo_rl_argv(*command, "rollout.env.name=chess"),
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert re.search(r"rollout\.env\.name must be one of \[.*'code_interpreter'", result.stderr)


@pytest.fixture(scope="module")
def sandbox_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A reward service with its code sandbox on; its URL."""
    log = tmp_path_factory.mktemp("reward") / "reward.log"
    proc, url = SERVICES["reward"].start(log, "--math-workers", "1", cwd=REPO, timeout=120)
    try:
        yield url
    finally:
        proc.stop()


def test_code_interpreter_runs_cells_in_the_sandbox(sandbox_url: str) -> None:
    async def go() -> None:
        client = SandboxClient(sandbox_url)
        try:
            env = make_env(EnvContext(
                EnvConfig(name="code_interpreter", observation_max_chars=64, stateful_cells=True),
                client,
            ))  # fmt: skip
            await env.reset({"prompt": "7*6?"})
            obs, _, done, info = await env.step("```python\nx = 7 * 6\nprint(x)\n```")
            assert obs == [{"role": "tool", "content": "42\n"}] and not done
            # State across cells: x is defined by the earlier cell, whose output is not repeated.
            obs, _, _, _ = await env.step("```python\nprint(x + 1)\n```")
            assert obs[0]["content"] == "43\n"
            obs, _, _, info = await env.step("```python\nprint('y' * 1000)\n```")
            assert len(obs[0]["content"]) <= 64 and "truncated" in obs[0]["content"]
            obs, _, _, info = await env.step("```python\nraise SystemExit(3)\n```")
            assert info["tool_calls"][0].error == "failed"
            obs, _, done, _ = await env.step("The answer is 42.")
            assert done and obs == []
            # Cells of many episodes run concurrently through one client.
            envs = [make_env(EnvContext(EnvConfig(name="code_interpreter"), client))
                    for _ in range(8)]  # fmt: skip
            outs = await asyncio.gather(
                *(e.step(f"```python\nprint({i} * {i})\n```") for i, e in enumerate(envs))
            )
            assert [o[0][0]["content"] for o in outs] == [f"{i * i}\n" for i in range(8)]
        finally:
            await client.aclose()

    run(go())


def test_sandbox_outage_retries_then_raises_env_unavailable() -> None:
    retries: list[float] = []

    async def go() -> None:
        client = SandboxClient(f"http://127.0.0.1:{free_port()}", backoff_s=0.05,
                               backoff_max_s=0.1, max_wait_s=0.3,
                               on_retry=lambda _r, d: retries.append(d))  # fmt: skip
        env = make_env(EnvContext(EnvConfig(name="code_interpreter"), client))
        try:
            with pytest.raises(EnvUnavailable, match="sandbox"):
                await env.step("```python\nprint(1)\n```")
        finally:
            await client.aclose()

    run(go())
    assert len(retries) >= 2
