"""What ``dynamo-rl up`` tells a user on its console, end to end (issue: warm-start progress,
dropped prompts, no learning signal).

GSM8K-layout rows through ``dynamo-rl data gsm8k``: 8 short questions and 12 padded past the tiny
model's context (512 tokens, byte-level: one token per character) minus ``max_tokens`` 4, so the
length policy drops 60% of them; every answer is ``#### <five digits>``, which 4 tokens cannot
write, so every reward is 0 and, with ``learner.equal_reward_warn_steps=2``, the learner's
no-signal warning fires at step 2. A 10-step warm start on a one-layer model, three RL steps.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, dynamo_rl_argv
from tests.launcher.test_up_data import convert_gsm8k

STEPS = 3
WARM = 10
LONG = 12
SHORT = 8


@pytest.mark.slow
def test_up_console_shows_warm_start_progress_dropped_prompts_and_no_signal(
    tmp_path: Path, redis_url: str
) -> None:
    filler = " Consider the numbers carefully." * 20  # 620 characters: past the limit
    rows = [{"question": f"What is {i} plus {i + 1}?" + (filler if i < LONG else ""),
             "answer": f"#### {10000 + 7 * i}"} for i in range(LONG + SHORT)]  # fmt: skip
    data, _said = convert_gsm8k(rows, tmp_path)

    run_dir = tmp_path / "run"
    argv = dynamo_rl_argv(
        "up", "--config", str(REPO / "configs" / "quickstart.yaml"), "--steps", str(STEPS),
        f"run.dir={run_dir}", "run.name=upconsole", f"rollout.dataset={data}",
        f"up.warm_start.steps={WARM}", "up.warm_start.batch_size=8", "up.warm_start.lr=3e-3",
        "up.tiny_model.hidden_size=32", "up.tiny_model.num_layers=1", "rollout.batch_size=4",
        "learner.train_batch_size=4", "rollout.sampling.max_tokens=4", "up.eval.prompts=0",
        "learner.equal_reward_warn_steps=2",
    )  # fmt: skip
    env = {**os.environ, "REDIS_URL": redis_url}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1200)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    lines = [re.sub(r"^\[\s*[\d.]+s\] ", "", x) for x in out.splitlines()]

    # Before training: what it will train on, and which setting to change.
    assert (
        f"training data {data}: {SHORT} of {LONG + SHORT} rows kept ({LONG} longer than 508 "
        "tokens dropped, rollout.prompt_len_policy=drop)" in lines
    ), out
    assert ("  data source openai/gsm8k: 20 rows, scored by math, gsm8k "
            "(reward.routes.openai/gsm8k)") in lines, out  # fmt: skip
    assert (
        "  model context 512 tokens, rollout.sampling.max_tokens 4: prompts up to 508 tokens"
        in lines
    ), out
    assert any(x.startswith("  60% of the prompts are dropped: to keep them, lower "
                            "rollout.sampling.max_tokens") for x in lines), out  # fmt: skip

    # The warm start's progress: its first and last steps, each step at most once.
    progress = [x for x in lines if x.startswith("warm start step ")]
    shown = [int(re.match(r"warm start step (\d+)/", x).group(1)) for x in progress]
    assert shown and shown[-1] == WARM and len(shown) == len(set(shown)), out
    assert all(
        re.fullmatch(
            rf"warm start step \d+/{WARM}  loss \d+\.\d{{4}}"
            r"(  \d+\.\d\d steps/s  ETA \d+s)?",
            x,
        )
        for x in progress
    ), progress
    assert "steps/s" in progress[-1] and progress[-1].endswith("ETA 0s"), progress

    # The children's warnings: once each, one line, naming the service and its log.
    dropped = [x for x in lines if "prompts exceed" in x]
    assert dropped == [f"warning from rollout0: {data}: {LONG} of {LONG + SHORT} prompts exceed "
                       "508 tokens: dropped; 60% of the prompts are dropped: to keep them, lower "
                       "rollout.sampling.max_tokens (4; prompts get the model's context of 512 "
                       "tokens minus it) or use a model with a longer context, or set "
                       "rollout.prompt_len_policy=truncate_left (more in "
                       f"{run_dir / 'logs' / 'rollout0.log'})"], out  # fmt: skip
    no_signal = [x for x in lines if "no learning signal" in x]
    assert len(no_signal) == 1, out
    assert no_signal[0].startswith("warning from learner: 2 train steps in a row with every "
                                   "reward 0: no learning signal."), no_signal  # fmt: skip
    assert no_signal[0].endswith(f"(more in {run_dir / 'logs' / 'learner.log'})"), no_signal
    # ... and every step line says it had no signal.
    steps = [x for x in lines if re.match(rf"step \d+/{STEPS}  ", x)]
    assert len(steps) >= STEPS and all(x.endswith("no signal (every reward equal)") for x in steps)
    assert any(x.startswith("2 warning(s) during the run") for x in lines), out
