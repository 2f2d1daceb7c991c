"""LoRA policies end to end under a real torchrun (gloo, CPU) on a tiny model: the rl mode fed by a
real Redis stream (KL to the reference = the policy with its adapters disabled), adapter-only
checkpoints and an exact resume from them, the final export a peft adapter folder; the sft and dpo
modes train their adapters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learner.steplog import read_log
from learner.tiny_model import build_tiny_model
from tasks.arith import write_preferences, write_task
from tests.learner import helpers as h

pytestmark = pytest.mark.slow

LORA = ["learner.lora.enabled=true", "learner.lora.rank=4", "learner.lora.alpha=8"]
RESUME_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "m", hidden_size=32, num_layers=2)


def checkpoint_keys(step_dir: Path) -> list[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return sorted(FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata)


def test_rl_with_lora_trains_adapters_only_and_resumes_exactly(
    tiny_model: Path, redis_url: str, tmp_path: Path
) -> None:
    fixed = h.make_groups(4, sizes=h.FIXED_SIZES)
    extra = [*h.RECIPE, *h.FIXED_LAYOUT, *LORA]
    # Uninterrupted: 4 steps.
    h.write_groups(redis_url, "full", fixed * 4)
    full = tmp_path / "full"
    h.run_learner(1, [*h.base_overrides(tiny_model, full, redis_url, "full"), *extra,
                    "learner.max_steps=4"], tmp_path / "full.log")  # fmt: skip
    records = read_log(full / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # B starts at zero: step 1 starts at the reference (the base), so its KL (averaged over the
    # step's updates) is tiny; it grows as the adapters move away from the base.
    assert 0 < records[0]["kl"] < 1e-4 and records[-1]["kl"] > 10 * records[0]["kl"]
    assert records[-1]["loss"] < records[0]["loss"]
    # The checkpoint holds the adapters and their AdamW state, not the frozen base.
    keys = checkpoint_keys(full / "checkpoints" / "step_000004")
    model_keys = [k for k in keys if k.startswith("model.")]
    assert len(model_keys) == 16 and all(".lora_" in k for k in model_keys), model_keys
    assert any(k.startswith("optim.state.") and ".lora_" in k and k.endswith("exp_avg")
               for k in keys)  # fmt: skip
    # The final export is a peft adapter folder that peft loads.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    final = full / "export" / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "model.safetensors").exists()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), final)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        assert float((adapted(ids).logits - base(ids).logits).abs().max()) > 1e-4

    # Interrupted after the step-2 checkpoint, then resumed to step 4: the same training.
    part = tmp_path / "part"
    overrides = [*h.base_overrides(tiny_model, part, redis_url, "part"), *extra]
    h.write_groups(redis_url, "part", fixed * 2)
    h.run_learner(1, [*overrides, "learner.max_steps=2"], tmp_path / "part.log")
    h.write_groups(redis_url, "part", fixed * 2)
    h.run_learner(1, [*overrides, "learner.max_steps=4"], tmp_path / "part.log")
    resumed = read_log(part / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    h.assert_same_training(resumed, records, tol=RESUME_TOLERANCE)


def test_sft_and_dpo_train_lora_adapters(tmp_path: Path) -> None:
    from tests.learner.test_offline import common, eval_records, run, torchrun, train_records

    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=2)
    task = write_task(tmp_path / "task", 400, 60, seed=0)
    sft_dir = tmp_path / "sft"
    sft = [
        "learner.mode=sft", f"learner.data.path={task['train']}",
        f"learner.data.eval_path={task['test']}", "learner.lr=1e-2",
        "learner.train_batch_size=16", "learner.max_steps=25", "learner.checkpoint.every=25",
        *LORA, "learner.lora.dropout=0.05", "learner.lora.target_modules=all-linear",
    ]  # fmt: skip
    run(torchrun(1, "learner", [*common(model, sft_dir), *sft]), tmp_path / "sft.log")
    evals = eval_records(sft_dir)
    assert evals[-1]["eval_loss"] < 0.95 * evals[0]["eval_loss"], evals
    assert (sft_dir / "export" / "final" / "adapter_model.safetensors").is_file()

    prefs = write_preferences(tmp_path / "prefs", 200, 40, seed=1, tiers=["medium"])
    dpo_dir = tmp_path / "dpo"
    dpo = [
        "learner.mode=dpo", f"learner.data.path={prefs['train']}", "learner.lr=5e-3",
        "learner.train_batch_size=16", "learner.max_steps=8", "learner.checkpoint.every=8",
        *LORA, "learner.lora.merged_export=true",
    ]  # fmt: skip
    run(torchrun(1, "learner", [*common(model, dpo_dir), *dpo]), tmp_path / "dpo.log")
    records = train_records(dpo_dir)
    # Step 1: the adapted policy is the base, i.e. the reference: the loss is log 2.
    assert records[0]["loss"] == pytest.approx(0.693147, abs=1e-5)
    assert records[-1]["loss"] < records[0]["loss"] and records[-1]["kl"] != 0.0
    assert (dpo_dir / "export" / "final" / "merged" / "model.safetensors").is_file()
