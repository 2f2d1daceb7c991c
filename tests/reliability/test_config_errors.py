"""Config mistakes across every section, each refused before anything starts.

Table-driven: each row is a YAML file (or an override) with one mistake and a pattern the message
must contain — the dotted key. Every row is checked through ``dynamo-rl config`` and through
``dynamo-rl up --config BAD``: exit 2, the key named, no traceback, and ``up`` leaves nothing
behind (no run folder, no child process). A few rows also run ``up`` as a real subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from dynamo_rl.cli import main as cli_main
from tests.conftest import dynamo_rl_argv

# (id, YAML text, extra overrides, pattern naming the key)
MISTAKES: list[tuple[str, str, list[str], str]] = [
    ("unknown-section", "trainer: {lr: 1}", [], r"trainer: unknown key"),
    ("yaml-list", "- run\n- learner", [], r"expected a mapping"),
    ("yaml-syntax", "run: {name: [unclosed", [], r"not valid YAML"),
    ("section-scalar", "allocator: 5", [], r"allocator"),
    ("run.name", "run: {name: 'my run'}", [], r"run\.name"),
    ("run.log_level", "run: {log_level: verbose}", [], r"run\.log_level"),
    ("run.seed", "run: {seed: abc}", [], r"run\.seed"),
    ("endpoints.engine_urls", "endpoints: {engine_urls: {a: 1}}", [], r"endpoints\.engine_urls"),
    ("endpoints.redis_url", "endpoints: {redis_url: [1, 2]}", [], r"endpoints\.redis_url"),
    ("endpoints.unknown", "endpoints: {reward: http://x}", [], r"endpoints\.reward: unknown key"),
    ("allocator.n_min>n_max", "allocator: {n_min: 30, n_max: 10}", [], r"allocator\.n_min"),
    ("allocator.priority", "allocator: {priority: stdev}", [], r"allocator\.priority"),
    ("allocator.port", "allocator: {port: 70000}", [], r"allocator\.port"),
    ("allocator.decay", "allocator: {decay: 0}", [], r"allocator\.decay"),
    ("reward.math.workers", "reward: {math: {workers: 0}}", [], r"reward\.math\.workers"),
    ("reward.code.concurrency", "reward: {code: {concurrency: -1}}", [],
     r"reward\.code\.concurrency"),
    ("reward.max_body_bytes", "reward: {max_body_bytes: 10}", [], r"reward\.max_body_bytes"),
    ("reward.code.ro_paths", "reward: {code: {ro_paths: [/tmp/]}}", [], r"reward\.code\.ro_paths"),
    ("reward.code.typo", "reward: {code: {timout_s: 3}}", [], r"reward\.code\.timout_s"),
    ("engine.device", "engine: {device: tpu}", [], r"engine\.device"),
    ("engine.max_batch_size", "engine: {max_batch_size: 0}", [], r"engine\.max_batch_size"),
    ("engine.dtype", "engine: {dtype: fp8}", [], r"engine\.dtype"),
    ("rollout.n<n_min", "rollout: {n: 4, n_min: 8}", [], r"allocator\.n_min <= allocator\.n_per_prompt"),
    ("rollout.worker_index", "rollout: {worker_index: 2, num_workers: 2}", [],
     r"rollout\.worker_index"),
    ("rollout.sampling.top_p", "rollout: {sampling: {top_p: 1.5}}", [],
     r"rollout\.sampling\.top_p"),
    ("rollout.engine_api", "rollout: {engine_api: grpc}", [], r"rollout\.engine_api"),
    ("learner.lr", "learner: {lr: 0}", [], r"learner\.lr"),
    ("learner.gspo-dual-clip",
     "learner: {algorithm: {policy_loss: {type: gspo, dual_clip: 3}, agg: seq-mean-token-mean}}",
     [], r"learner\.algorithm\.policy_loss"),
    ("learner.advantage.type", "learner: {algorithm: {advantage: {type: a2c}}}", [],
     r"learner\.algorithm\.advantage"),
    ("learner.mini_batch_size", "learner: {train_batch_size: 32, mini_batch_size: 64}", [],
     r"learner\.mini_batch_size"),
    ("learner.gae-no-critic", "learner: {algorithm: {advantage: {type: gae}}}", [],
     r"learner\.(critic|algorithm\.advantage)"),
    ("up.engines", "up: {engines: 0}", [], r"up\.engines"),
    ("up.task", "up: {task: gsm8k}", [], r"up\.task"),
    ("up.tiny_model.hidden_size", "up: {tiny_model: {hidden_size: 4}}", [],
     r"up\.tiny_model\.hidden_size"),
    ("up.tiny_model.num_heads", "up: {tiny_model: {hidden_size: 100, num_heads: 3}}", [],
     r"up\.tiny_model\.num_heads"),
    ("up.tiny_model.num_kv_heads", "up: {tiny_model: {num_heads: 4, num_kv_heads: 3}}", [],
     r"up\.tiny_model\.num_kv_heads"),
    ("up.health_timeout_s", "up: {health_timeout_s: -1}", [], r"up\.health_timeout_s"),
    ("up.warm_start.target_exact", "up: {warm_start: {check_rows: 0, target_exact: 0.5}}", [],
     r"up\.warm_start\.target_exact needs up\.warm_start\.check_rows"),
    ("learner.data.stop_exact", "learner: {data: {stop_exact: 0.5}}", [],
     r"learner\.data\.stop_exact .*eval_path"),
    ("learner.data.stop_exact-dpo", "learner: {mode: dpo, data: {stop_exact: 0.5, path: t.parquet, "
     "eval_path: e.parquet}}", [], r"learner\.data\.stop_exact .*got mode 'dpo'"),
    ("dynamic+token-mean", "rollout: {allocation: dynamic}\nlearner: {algorithm: {agg: token-mean}}",
     [], r"rollout\.allocation: dynamic .*learner\.algorithm\.agg: token-mean.*1\.13-2\.51x"),
    ("override-unknown", "", ["learner.lrr=1"], r"learner\.lrr: unknown key"),
    ("override-no-equals", "", ["learner.lr"], r"expected KEY=VALUE"),
    ("override-bad-value", "", ["allocator.n_max=many"], r"allocator\.n_max"),
]  # fmt: skip


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    # Every file also points the run folder into tmp_path, so a side effect would be visible;
    # rows that break the file's syntax or top level are written as they are.
    if text and not text.startswith(("-", "run: {name: [")) and not text.startswith("run:"):
        text = f"run: {{dir: '{tmp_path}/run'}}\n{text}"
    path.write_text(textwrap.dedent(text) + "\n")
    return path


def _run_in_process(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli_main(argv)
        except SystemExit as e:
            code = int(e.code or 0)
    return code, err.getvalue()


def _children() -> set[int]:
    """Pids of this process's children (a started service would be one)."""
    out = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        children = (task / "children").read_text().split()
        out.update(int(c) for c in children)
    return out


@pytest.mark.parametrize(("text", "overrides", "key"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])  # fmt: skip
def test_mistake_is_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, overrides: list[str], key: str
) -> None:
    monkeypatch.chdir(tmp_path)  # the default run folder (runs/<name>) would land here
    for var in ("REDIS_URL", "ALLOCATOR_ADDR", "REWARD_URL", "ENGINE_URLS", "DYNAMO_CONTROL_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    path = _write(tmp_path, text)
    before = _children()
    for argv in (
        ["config", "--config", str(path), *overrides],
        ["up", "--config", str(path), "--steps", "1", *overrides],
    ):
        code, err = _run_in_process(argv)
        assert code == 2, (argv, err)
        assert re.search(key, err), (argv, err)
        assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no run folder, no data
    assert _children() <= before


def test_there_are_at_least_twenty_mistakes_across_every_section() -> None:
    assert len(MISTAKES) >= 20
    sections = {"run", "endpoints", "allocator", "reward", "engine", "rollout", "learner", "up"}
    covered = {m[0].split(".")[0] for m in MISTAKES}
    assert sections <= covered


@pytest.mark.parametrize(
    "row", [m for m in MISTAKES if m[0] in ("allocator.n_min>n_max", "learner.gspo-dual-clip",
                                           "up.engines", "yaml-syntax")],
    ids=lambda m: m[0],
)  # fmt: skip
def test_up_subprocess_exits_2_before_starting_anything(tmp_path: Path, row: tuple) -> None:
    _id, text, overrides, key = row
    path = _write(tmp_path, text)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = subprocess.run(
        [*dynamo_rl_argv("up", "--config", str(path), "--steps", "1", *overrides)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert re.search(key, out.stderr) and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == ""  # not even the first progress line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]
