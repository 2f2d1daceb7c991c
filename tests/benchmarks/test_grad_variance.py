"""The gradient-variance benchmark's own logic: the batch gradient it composes from per-token
sketches is the sketch of the learner's objective backpropagated through the model, for both
weightings; and its ``--quick`` form runs end to end."""

from __future__ import annotations

import json

import pytest
import torch

from tests.benchmarks.bench import bench_module


@pytest.fixture(scope="module")
def gv():
    bench_module("sample_efficiency")
    return bench_module("grad_variance")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from learner.tiny_model import build_tiny_model

    path = build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "m",
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        max_positions=64,
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    return model, tok


@pytest.fixture(scope="module")
def pool(gv, tiny):
    from sample_efficiency import Settings

    model, tok = tiny
    s = Settings(max_new_tokens=5)
    g = gv.GVSettings(prompts=3, pool=4, sketch=512, micro_batch=5)
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {a} + {a}?"}],
            "reward_model": {"ground_truth": str(2 * a)},
        }
        for a in (3, 14, 25)
    ]
    torch.manual_seed(0)
    p = gv.build_pool(model, tok, rows, g, s, seed=1)
    # A random tiny model solves nothing: give the pool mixed rewards so advantages are not zero.
    p["reward"] = torch.rand(p["reward"].shape, generator=torch.Generator().manual_seed(2)) < 0.5
    p["reward"] = p["reward"].float()
    return p, g


def _learner_gradient(gv, model, pool, idx, groups, agg, micro):
    """The learner's objective on the batch, backpropagated through the model, then sketched."""
    from learner.algorithms import group_token_counts, grpo_advantages, token_logprobs_and_entropy
    from learner.objective import ObjectiveInputs, rl_objective

    model.zero_grad(set_to_none=True)
    mask = pool["mask"][idx]
    gids = torch.tensor(groups)
    adv = grpo_advantages(pool["reward"].reshape(-1)[idx], gids)[:, None] * mask
    gt = group_token_counts(gids, mask)
    norm = float(mask.sum()) if agg == "token-mean" else float(len(set(groups)))
    logps, ents = [], []
    for i in idx.tolist():
        p_ids, r_ids, _ = pool["samples"][i]
        logits = model(input_ids=torch.tensor([p_ids + r_ids])).logits[:, len(p_ids) - 1 : -1]
        lp, en = token_logprobs_and_entropy(logits.float(), torch.tensor([r_ids]))
        pad = mask.shape[1] - len(r_ids)
        logps.append(torch.nn.functional.pad(lp[0], (0, pad)))
        ents.append(torch.nn.functional.pad(en[0], (0, pad)))
    logp, ent = torch.stack(logps), torch.stack(ents)
    total = 0.0
    for lo in range(0, len(idx), micro):
        sl = slice(lo, lo + micro)
        out = rl_objective(
            ObjectiveInputs(
                logp=logp[sl],
                old_logp=logp[sl].detach(),
                advantages=adv[sl],
                mask=mask[sl],
                entropy=ent[sl],
                group_tokens=gt[sl],
            ),
            gv.algo_config(agg),
            normalizer=norm,
        )
        total = total + out.loss  # accumulation over micro-batches: gradients of a sum add up
    total.backward()
    return pool["sketch"]([p.grad.unsqueeze(0) for p in pool["params"]])[0]


@pytest.mark.parametrize("agg", ["token-mean", "prompt-mean"])
def test_composed_gradient_is_the_learners_backward(gv, tiny, pool, agg):
    model, _ = tiny
    p, g = pool
    idx = torch.tensor([0, 1, 1, 3, 4, 6, 8, 9, 10, 11, 11])  # unequal groups, repeats
    groups = (idx // g.pool).tolist()
    composed, _ = gv.batch_gradient(p, idx, groups, agg, g.micro_batch)
    want = _learner_gradient(gv, model, p, idx, groups, agg, g.micro_batch)
    assert float(want.norm()) > 0
    assert torch.allclose(composed, want, rtol=1e-4, atol=1e-6 * float(want.norm()))


def test_weightings_differ_when_groups_are_unequal(gv, pool):
    p, g = pool
    idx = torch.tensor([0, 1, 2, 3, 3, 3, 4, 8])
    groups = (idx // g.pool).tolist()
    tm, _ = gv.batch_gradient(p, idx, groups, "token-mean", g.micro_batch)
    pm, _ = gv.batch_gradient(p, idx, groups, "prompt-mean", g.micro_batch)
    assert not torch.allclose(tm, pm)


def test_sketch_preserves_inner_products_on_average(gv):
    params = [torch.zeros(4000), torch.zeros(50, 20)]
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(1, 4000, generator=gen), torch.randn(1, 50, 20, generator=gen)]
    full = float(sum(t.square().sum() for t in x))
    ests = [float(gv.Sketch(params, 1024, seed=s)(x).square().sum()) for s in range(20)]
    assert sum(ests) / len(ests) == pytest.approx(full, rel=0.05)


@pytest.mark.slow
def test_quick_run_writes_the_report(gv, tmp_path):
    out = tmp_path / "gv"
    assert gv.main(["--quick", "--cache", str(tmp_path / "cache"), "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert list(report["checkpoints"]) == ["warm start", "RL step 2"]
    for ck in report["checkpoints"].values():
        assert set(ck["cases"]) == {f"B{b}/{a}" for b in (2, 4) for a in gv.ALLOCATORS}
        for case in ck["cases"].values():
            assert 0.0 <= case["zero_adv_share"][0] <= 1.0
            assert set(case) >= {"token-mean", "prompt-mean"}
