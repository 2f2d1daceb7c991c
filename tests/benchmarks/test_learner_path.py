"""What the training benchmarks measure is what the learner trains: one batch through the
learner's path (a real Redis stream, the learner process under torchrun, its exported weights)
and through ``benchmarks/sample_efficiency.py``'s path (its batch builder, its method's
algorithm and config, the learner step it calls in process) leaves the same parameters, for two
methods, one with the gradient statistics on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from dynamo_rl.codec import TrajectoryGroup
from learner.steplog import read_log
from learner.tiny_model import build_tiny_model
from tests.benchmarks.bench import bench_module
from tests.learner.helpers import base_overrides, make_groups, run_learner, write_groups

pytestmark = pytest.mark.slow

SIZES = [2, 3, 4, 4]  # uneven groups, as allocation gives them


@pytest.fixture(scope="module")
def se():
    return bench_module("sample_efficiency")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "m", hidden_size=32, num_layers=2)


def as_generated(groups: list[TrajectoryGroup]) -> tuple:
    """The groups as the benchmark's generation hands them over: left-padded prompts, responses
    right-padded with their mask, sampling log-probs, rewards and each row's group."""
    rows = [(g, r) for g in groups for r in g.responses]
    width = max(len(g.prompt_token_ids) for g in groups)
    t_len = max(len(r.token_ids) for _, r in rows)
    seq = torch.zeros(len(rows), width + t_len, dtype=torch.long)
    attn = torch.zeros(len(rows), width, dtype=torch.long)
    rmask = torch.zeros(len(rows), t_len, dtype=torch.long)
    logp = torch.zeros(len(rows), t_len)
    for j, (g, r) in enumerate(rows):
        p, n = list(g.prompt_token_ids), len(r.token_ids)
        seq[j, width - len(p) : width] = torch.tensor(p)
        attn[j, width - len(p) :] = 1
        seq[j, width : width + n] = torch.tensor(list(r.token_ids))
        rmask[j, :n] = 1
        logp[j, :n] = torch.tensor(list(r.logprobs))
    rewards = torch.tensor([r.reward for _, r in rows])
    group_of = [gi for gi, g in enumerate(groups) for _ in g.responses]
    return seq, width, attn, rmask, logp, rewards, group_of


def learner_section(lc) -> dict:
    """The parts of a learner config that decide an update, as a config file holds them."""
    return {
        "lr": lc.lr,
        "train_batch_size": lc.train_batch_size,
        "mini_batch_size": lc.mini_batch_size,
        "micro_batch_size": lc.micro_batch_size,
        "ppo_epochs": lc.ppo_epochs,
        "optim": lc.optim.model_dump(mode="json"),
        "algorithm": lc.algorithm.model_dump(mode="json"),
    }


@pytest.mark.parametrize("method", ["mod", "grad"])
def test_a_batch_through_the_learner_and_through_the_benchmark_gives_the_same_weights(
    se, model_dir: Path, redis_url: str, tmp_path: Path, method: str
) -> None:
    groups = make_groups(len(SIZES), sizes=SIZES, seed=3)
    s = se.Settings(lr=1e-2, micro_batch=3)
    spec = se.method_specs(s.decay)[method]
    lc = se.learner_config(s, se.method_algo(spec, s), groups=len(groups))

    # The benchmark's path.
    model, tok = se.load(model_dir)
    model.train()
    step = se.learner_step(model, tok, lc, grad_stats=spec.method == "grad")
    seq, width, attn, rmask, logp, rewards, group_of = as_generated(groups)
    prompt_ids = [g.prompt_id for g in groups]
    result = step(se.rl_batch(seq, width, attn, rmask, logp, rewards, group_of, prompt_ids, 1.0))
    assert (len(result.grad_records) == len(groups)) == (method == "grad")

    # The learner's path: the same groups on a real stream, one step, the exported weights.
    name = f"path-{method}"
    write_groups(redis_url, name, groups)
    config = tmp_path / "learner.yaml"
    sections = {"learner": learner_section(lc)}
    if method == "grad":
        sections["allocator"] = {"method": "grad"}  # the learner collects the statistics
    config.write_text(yaml.safe_dump(sections))
    overrides = [o for o in base_overrides(model_dir, tmp_path / name, redis_url, name)
                 if not o.startswith(("learner.lr=", "learner.micro_batch_size="))]  # fmt: skip
    run_learner(1, ["--config", str(config), *overrides, "learner.max_steps=1"], tmp_path / "l.log")
    [record] = read_log(tmp_path / name / "metrics.jsonl")
    assert record["responses"] == sum(SIZES)
    assert ("grad_stats_prompts" in record) == (method == "grad")
    assert record["loss"] == pytest.approx(result.record["loss"], rel=1e-5, abs=1e-7)

    from transformers import AutoModelForCausalLM

    learned = AutoModelForCausalLM.from_pretrained(
        tmp_path / name / "export" / "final"
    ).state_dict()
    start = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    mine = model.state_dict()
    moved = 0
    for key, want in learned.items():
        # The same update to float32 rounding (FSDP2 flattens and reduces the gradients on its
        # own): within 1e-6 of the update's size, and it moved.
        delta = (want - start[key]).abs().max()
        assert (mine[key] - want).abs().max() <= 1e-6 + 1e-4 * delta, key
        moved += int(delta > 0)
    assert moved > len(learned) // 2
