"""The sft and dpo modes end to end under a real torchrun (2 ranks, gloo, CPU) on a tiny model:
the SFT loss falls, a resumed run continues mid-epoch from the same data position with the same
losses, ``dynamo-rl sft`` writes a loadable HF model to --out, and DPO lifts the reward accuracy
on held-out pairs of the arith preference set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dynamo_rl.procs import free_port
from learner.steplog import read_log
from learner.tiny_model import build_tiny_model
from tasks.arith import generate_rows, write_preferences, write_task
from tests.conftest import REPO
from tests.learner.helpers import TORCHRUN, learner_env

pytestmark = pytest.mark.slow

WARM_STEPS, DPO_STEPS = 500, 80
TIERS = ["easy", "medium", "medium-rev", "medium-sub"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "m", hidden_size=32, num_layers=2)


@pytest.fixture(scope="module")
def arith(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("arith")
    train, test = generate_rows(200, 60, seed=0)
    paths = {}
    for name, rows in (("train", train), ("test", test)):
        paths[name] = out / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), paths[name])
    return paths


def run(cmd: list[str], log: Path, timeout: float = 400) -> None:
    with open(log, "ab") as out:
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=learner_env(),
                                cwd=REPO, timeout=timeout, check=False)  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}:\n{log.read_text()[-6000:]}")


def torchrun(nproc: int, command: str, args: list[str]) -> list[str]:
    return [
        TORCHRUN, "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", "dynamo_rl.cli", command, *args,
    ]  # fmt: skip


def common(model: Path, run_dir: Path) -> list[str]:
    return [
        f"learner.model={model}",
        f"run.dir={run_dir}",
        "learner.metrics_port=null",
        "learner.push.every=0",
        "learner.checkpoint.export_every=0",
    ]


def train_records(run_dir: Path) -> list[dict]:
    return [r for r in read_log(run_dir / "metrics.jsonl") if r.get("kind") != "eval"]


def eval_records(run_dir: Path) -> list[dict]:
    return [r for r in read_log(run_dir / "metrics.jsonl") if r.get("kind") == "eval"]


def test_sft_two_ranks_loss_falls_and_resume_continues_mid_epoch(
    tiny_model: Path, arith: dict[str, Path], tmp_path: Path
) -> None:
    sft = [
        "learner.mode=sft",
        f"learner.data.path={arith['train']}",
        f"learner.data.eval_path={arith['test']}",
        "learner.data.filter_key=extra_info.tier",
        f"learner.data.filter_values=[{','.join(TIERS)}]",
        "learner.lr=3e-3",
        "learner.train_batch_size=24",
        "learner.micro_batch_size=8",  # 12 rows a rank: micro-batches of 8 and 4
        "learner.checkpoint.every=10",
    ]
    # Uninterrupted: 30 steps of 24 rows over ~130 rows (epochs end mid-batch).
    full = tmp_path / "full"
    run(torchrun(2, "learner", [*common(tiny_model, full), *sft, "learner.max_steps=30"]),
        tmp_path / "full.log")  # fmt: skip
    records = train_records(full)
    assert [r["step"] for r in records] == list(range(1, 31))
    losses = [r["loss"] for r in records]
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.5 * first, losses
    evals = eval_records(full)
    assert [e["step"] for e in evals] == [0, 30]
    assert evals[1]["eval_loss"] < 0.6 * evals[0]["eval_loss"], evals
    assert (full / "export" / "final" / "model.safetensors").is_file()

    # Interrupted after the checkpoint at step 10 (position 240: mid-epoch), then resumed.
    part = tmp_path / "part"
    run(torchrun(2, "learner", [*common(tiny_model, part), *sft, "learner.max_steps=10"]),
        tmp_path / "part.log")  # fmt: skip
    state = json.loads((part / "checkpoints" / "step_000010" / "trainer_state.json").read_text())
    assert state["extra"]["data_position"] == 240
    n_rows = sum(
        r["extra_info"]["tier"] in TIERS for r in pq.read_table(arith["train"]).to_pylist()
    )
    assert 240 % n_rows != 0  # the resume point is mid-epoch
    run(torchrun(2, "learner", [*common(tiny_model, part), *sft, "learner.max_steps=20"]),
        tmp_path / "part.log")  # fmt: skip
    resumed = train_records(part)
    assert [r["step"] for r in resumed] == list(range(1, 21))
    for a, b in zip(resumed[10:], records[10:20], strict=True):
        assert a["data_position"] == b["data_position"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5), a["step"]


def test_sft_command_writes_the_hf_model_to_out(
    tiny_model: Path, arith: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "sft"
    # Exactly the flags dynamo-rl up passes.
    run([sys.executable, "-m", "dynamo_rl.cli", "sft", "--model", str(tiny_model),
         "--data", str(arith["train"]), "--out", str(out), "--steps", "12", "--lr", "0.003",
         "--batch-size", "16", "--tiers", ",".join(TIERS), "--seed", "3"],
        tmp_path / "sft.log")  # fmt: skip
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (out / name).is_file(), name
    records = train_records(tmp_path / "sft.run")
    assert [r["step"] for r in records] == list(range(1, 13))
    assert all(r["examples"] == 16 for r in records)
    assert records[-1]["loss"] < records[0]["loss"]
    # One checkpoint (at the end), no intermediate exports.
    assert [p.name for p in (tmp_path / "sft.run" / "checkpoints").iterdir()] == ["step_000012"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.hidden_size == 32
    # A config mistake names the key and exits 2 before anything runs.
    bad = subprocess.run(
        [sys.executable, "-m", "dynamo_rl.cli", "sft", "--model", str(tiny_model),
         "--data", str(tmp_path / "missing.parquet"), "--out", str(out)],
        capture_output=True, text=True, env=learner_env(), cwd=REPO, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "learner.data.path: no such file" in bad.stderr


def test_sft_stops_at_the_first_evaluation_reaching_stop_exact(
    tiny_model: Path, tmp_path: Path
) -> None:
    # Four rows to memorise, evaluated on themselves every 5 steps: exact match climbs from 0 to 1
    # well before max_steps, and the run must end at the first evaluation at or past the target.
    rows = [{"prompt": f"{a}+{a}=", "extra_info": {"answer": f"\\boxed{{{2 * a}}}"}}
            for a in (1, 2, 3, 4)]  # fmt: skip
    data = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    out, target, max_steps = tmp_path / "sft", 0.5, 400
    run([sys.executable, "-m", "dynamo_rl.cli", "sft", "--model", str(tiny_model),
         "--data", str(data), "--out", str(out), "--steps", str(max_steps), "--lr", "0.003",
         "--batch-size", "4", f"learner.data.eval_path={data}", "learner.data.eval_every=5",
         f"learner.data.stop_exact={target}"],
        tmp_path / "sft.log")  # fmt: skip
    evals = eval_records(tmp_path / "sft.run")
    assert [e["step"] for e in evals] == list(range(0, 5 * len(evals), 5))
    assert all(e["eval_exact"] < target for e in evals[:-1]), evals
    assert evals[-1]["eval_exact"] >= target
    stop = evals[-1]["step"]
    assert 0 < stop < max_steps
    assert train_records(tmp_path / "sft.run")[-1]["step"] == stop
    assert (out / "model.safetensors").is_file()


def test_dpo_two_ranks_lifts_reward_accuracy_on_held_out_pairs(tmp_path: Path) -> None:
    # The pipeline the docs show: a short supervised warm start on the medium tier (one
    # process, the sft command), then DPO on 2 ranks against it on arith preference pairs whose
    # held-out prompts the model never saw.
    init = build_tiny_model(tmp_path / "init", hidden_size=64, num_layers=2)
    task = write_task(tmp_path / "task", 3000, 200, seed=0)
    warm = tmp_path / "warm"
    run([sys.executable, "-m", "dynamo_rl.cli", "sft", "--model", str(init),
         "--data", str(task["train"]), "--out", str(warm), "--steps", str(WARM_STEPS),
         "--lr", "0.003", "--batch-size", "32", "--tiers", "medium", "--seed", "0",
         "learner.optim.warmup_steps=20"], tmp_path / "warm.log")  # fmt: skip
    prefs = write_preferences(tmp_path / "prefs", 3000, 600, seed=1, tiers=["medium"])
    run_dir = tmp_path / "dpo"
    dpo = [
        "learner.mode=dpo",
        f"learner.data.path={prefs['train']}",
        f"learner.data.eval_path={prefs['test']}",
        "learner.data.eval_every=40",
        "learner.dpo.beta=0.1",
        "learner.lr=1.5e-3",
        "learner.train_batch_size=32",
        "learner.micro_batch_size=16",
        f"learner.max_steps={DPO_STEPS}",
        f"learner.checkpoint.every={DPO_STEPS}",
    ]
    run(torchrun(2, "learner", [*common(warm, run_dir), *dpo]), tmp_path / "dpo.log")
    records = train_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, DPO_STEPS + 1))
    # Step 1 starts at the reference: every implicit reward is 0 and the loss is log 2.
    assert records[0]["loss"] == pytest.approx(0.693147, abs=1e-5)
    assert records[0]["reward_accuracy"] == 0.0
    evals = eval_records(run_dir)
    before, after = evals[0], evals[-1]
    assert [e["step"] for e in evals] == list(range(0, DPO_STEPS + 1, 40))
    assert before["eval_reward_accuracy"] == 0.0 and before["eval_kl"] == pytest.approx(0.0)
    assert before["eval_pairs"] == after["eval_pairs"] > 100
    assert after["eval_reward_accuracy"] > 0.8, (before, after)
    assert after["eval_reward_margin"] > 0 and after["eval_loss"] < before["eval_loss"]
    assert after["eval_reward_chosen"] > after["eval_reward_rejected"]
    assert (run_dir / "export" / "final" / "model.safetensors").is_file()

    # IPO through the same path (one rank): at the reference h = 0, so the loss is 1/(2β)^2.
    ipo_dir = tmp_path / "ipo"
    run([sys.executable, "-m", "dynamo_rl.cli", "learner", *common(warm, ipo_dir), *dpo[:2],
         "learner.dpo.kind=ipo", "learner.dpo.beta=0.5", "learner.lr=3e-4",
         "learner.train_batch_size=8", "learner.max_steps=3"], tmp_path / "ipo.log")  # fmt: skip
    ipo = train_records(ipo_dir)
    assert ipo[0]["loss"] == pytest.approx(1.0, abs=1e-5)
    assert ipo[-1]["loss"] < ipo[0]["loss"]


def test_sft_examples_too_long_are_one_warning_for_the_user(
    tiny_model: Path, tmp_path: Path
) -> None:
    rows = [{"prompt": "1+1=" + (" pad" * 40 if i % 2 else ""), "response": "2"} for i in range(8)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run([sys.executable, "-m", "dynamo_rl.cli", "sft", "--model", str(tiny_model), "--data",
         str(data), "--out", str(tmp_path / "sft"), "--steps", "2", "--batch-size", "4",
         "learner.max_seq_len=64"], tmp_path / "sft.log")  # fmt: skip
    from dynamo_rl.notices import read_notices

    (notice,) = read_notices(tmp_path / "sft.run")
    assert (notice.kind, notice.about) == ("examples_too_long", str(data))
    assert (
        notice.message == f"{data}: 4 of 8 examples longer than learner.max_seq_len (64) left out"
    )
