"""The stability benchmark's logic: stale, multi-epoch updates reach the learner's objective with
their old log-probs and IS weights; mini-batches hold whole groups; the stability verdict and the
seed intervals are what the docs define; and its ``--quick`` form runs end to end."""

from __future__ import annotations

import math

import pytest
import torch

from tests.benchmarks.bench import bench_module, quick_report, rollouts


@pytest.fixture(scope="module")
def se():
    return bench_module("sample_efficiency")


@pytest.fixture(scope="module")
def stab(se):
    return bench_module("stability")


def _batch():
    """8 rollouts in 3 groups of sizes 2, 4, 2: left-padded prompts, responses of varied length."""
    return rollouts([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1, 1, 1, 2, 2])


def _algo(agg: str = "token-mean", modulate: bool = False):
    from dynamo_rl.config.learner import AlgorithmConfig, ModulationConfig, PpoLoss

    return AlgorithmConfig(
        policy_loss=PpoLoss(clip_low=0.2, clip_high=0.28, dual_clip=10.0),
        agg=agg,
        modulation=ModulationConfig(enabled=modulate),
        is_cap=2.0,
    )


def _grad(se, model, algo, micro, **kw):
    model.zero_grad(set_to_none=True)
    seq, prompt_attn, rmask, rewards, group_of = _batch()
    stats = se.accumulate_gradients(
        model, seq, prompt_attn, rmask, rewards, group_of, algo, micro, 1.0, **kw
    )
    flat = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return flat, stats


def test_is_weights_scale_the_update(se, tiny):
    """Inside the clip range the PPO gradient is linear in the advantages, so IS weights of 2 on
    every token double it; dropping the weights would leave it unchanged."""
    _, _, rmask, _, _ = _batch()
    plain, _ = _grad(se, tiny, _algo(), 8)
    doubled, _ = _grad(se, tiny, _algo(), 8, is_weights=2.0 * rmask.float())
    assert plain.abs().sum() > 0
    assert torch.allclose(doubled, 2 * plain, rtol=1e-4, atol=1e-7)


def test_old_logp_moves_the_ratio_and_the_clip(se, tiny):
    """With old log-probs from other weights the ratio leaves 1 and tokens get clipped; without
    them the update is on-policy (ratio 1, nothing clipped)."""
    seq, prompt_attn, rmask, _, _ = _batch()
    with torch.no_grad():
        logp, _ = se.forward_logp(tiny, seq, prompt_attn, rmask, 1.0)
    _, on = _grad(se, tiny, _algo(), 4)
    assert on["ratio_mean"] == pytest.approx(1.0)
    assert on["clipfrac_upper"] + on["clipfrac_lower"] == 0.0
    shifted = logp + 0.5 * torch.where(torch.arange(logp.shape[1]) % 2 == 0, 1.0, -1.0)
    g_off, off = _grad(se, tiny, _algo(), 4, old_logp=shifted * rmask)
    assert off["ratio_mean"] != pytest.approx(1.0, abs=1e-3)
    assert off["clipfrac_upper"] + off["clipfrac_lower"] > 0
    g_on, _ = _grad(se, tiny, _algo(), 4)
    assert not torch.allclose(g_on, g_off)


def test_prompt_mean_does_not_depend_on_micro_batches(se, tiny):
    """Prompt-mean with the batch's group count and each row's group token count: splitting the
    batch into micro-batches (cutting group 1 in two) leaves the gradient unchanged, and it is not
    the token-mean gradient (the groups' token counts differ)."""
    whole, _ = _grad(se, tiny, _algo("prompt-mean"), 8)
    split, _ = _grad(se, tiny, _algo("prompt-mean"), 3)
    assert whole.abs().sum() > 0
    assert torch.allclose(whole, split, rtol=1e-4, atol=1e-7)
    token, _ = _grad(se, tiny, _algo("token-mean"), 8)
    assert not torch.allclose(whole, token, rtol=1e-3)


def test_prompt_mean_weighs_every_group_equally(se, tiny):
    """The prompt-mean batch gradient is the mean over groups of each group's own token-mean
    gradient (advantages from the whole batch)."""
    from learner.algorithms import grpo_advantages, policy_loss

    seq, prompt_attn, rmask, rewards, group_of = _batch()
    got, _ = _grad(se, tiny, _algo("prompt-mean"), 8)
    adv = grpo_advantages(rewards, torch.tensor(group_of))[:, None] * rmask
    tiny.zero_grad(set_to_none=True)
    logp, _ = se.forward_logp(tiny, seq, prompt_attn, rmask, 1.0)
    groups = sorted(set(group_of))
    for g in groups:
        rows = torch.tensor([i for i, x in enumerate(group_of) if x == g])
        loss, _ = policy_loss(logp[rows], logp[rows].detach(), adv[rows], rmask[rows],
                              clip_low=0.2, clip_high=0.28, dual_clip=10.0)  # fmt: skip
        (loss / len(groups)).backward(retain_graph=True)
    want = torch.cat([p.grad.flatten() for p in tiny.parameters() if p.grad is not None])
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)


def test_method_agg_is_the_recipes_for_allocating_methods(se):
    s = se.Settings()
    specs = se.method_specs(s.decay)
    assert s.alloc_agg == "prompt-mean"
    assert {m: se.method_agg(specs[m], s) for m in ("grpo", "alloc", "mod", "dynamo")} == {
        "grpo": "token-mean",
        "alloc": "prompt-mean",
        "mod": "token-mean",
        "dynamo": "prompt-mean",
    }


def test_mini_batches_hold_whole_groups(stab):
    group_of = [0, 0, 1, 1, 1, 2, 3, 3, 4]
    minis = stab.mini_batch_rows(group_of, 2)
    assert sorted(r for m in minis for r in m) == list(range(len(group_of)))
    assert len(minis) == 2
    for m in minis:
        for g in {group_of[r] for r in m}:
            assert all(r in m for r, x in enumerate(group_of) if x == g)
    assert len(stab.mini_batch_rows(group_of, 99)) == 5  # at most one per group


def _run(drop: float = 0.0, entropies=(1.0, 1.0, 1.0, 1.0, 1.0), norms=(1.0, 1.0)):
    """A run's record; the first step's grad norms are (1, 1), the later steps' ``norms``."""
    log = [{"entropy": e, "grad_norms": [1.0, 1.0] if i == 0 else list(norms)}
           for i, e in enumerate(entropies)]  # fmt: skip
    return {"start": {"sampled": 0.40, "greedy": 0.5}, "final": {"sampled": 0.40 - drop,
            "greedy": 0.5}, "log": log}  # fmt: skip


def test_stability_verdict(stab):
    st = stab.StabSettings()
    assert stab.run_verdict(_run(), st)["stable"]
    assert stab.run_verdict(_run(drop=0.019), st)["stable"]
    assert not stab.run_verdict(_run(drop=0.021), st)["stable"]
    collapse = _run(entropies=(1.0, 0.2, 0.2, 0.2, 0.2))
    assert not stab.run_verdict(collapse, st)["stable"]
    explode = _run(entropies=(1.0, 5.0, 5.0, 5.0, 5.0))
    assert not stab.run_verdict(explode, st)["stable"]
    assert stab.run_verdict(_run(entropies=(1.0, 0.3, 0.3, 0.3, 0.3)), st)["stable"]
    spiky = _run(norms=(1.0, 6.0))  # one norm above 5 × the first step's median per step
    v = stab.run_verdict(spiky, st)
    assert v["grad_norm_spikes"] == 4 and v["grad_norm_max_ratio"] == pytest.approx(6.0)
    assert v["stable"]  # spikes are reported, they do not decide
    assert stab.run_verdict(_run(norms=(1.0, 4.9)), st)["grad_norm_spikes"] == 0


def test_largest_stable_lr_needs_every_seed(stab):
    st = stab.StabSettings()
    runs = []
    for lr, drops in ((1e-4, (0.0, 0.0)), (1e-3, (0.0, 0.05)), (1e-2, (0.1, 0.1))):
        for seed, d in enumerate(drops):
            for m in stab.METHODS:
                runs.append({**_run(drop=d), "method": m, "lr": lr, "seed": seed})
    summary = stab.summarise(runs, st)
    assert summary["grpo"]["largest_stable_lr"] == 1e-4
    assert not summary["grpo"]["by_lr"]["0.001"]["stable"]


def test_t_interval_and_pairing(se):
    r = se.t_interval([1.0, 2.0, 3.0])
    assert r["mean"] == 2.0 and r["n"] == 3
    assert r["ci"] == pytest.approx([2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)])
    assert math.isnan(se.t_interval([1.0])["ci"][0])
    p = se.paired({0: 0.5, 1: 0.7, 2: None, 3: 0.4}, {0: 0.4, 1: 0.4, 2: 0.1})
    assert p["seeds"] == [0, 1] and p["mean"] == pytest.approx(0.2)


@pytest.mark.slow
def test_quick_run_writes_the_report(stab, tmp_path):
    report = quick_report(stab, tmp_path, "stab")
    assert set(report["summary"]) == set(stab.METHODS)
    for res in report["summary"].values():
        assert set(res["by_lr"]) == {"0.001", "0.01"}
    for run in report["runs"]:
        assert len(run["log"]) == 3
        # 2 epochs × 2 mini-batches: four optimizer steps per RL step
        assert all(len(r["grad_norms"]) == 4 for r in run["log"])
        assert all({"entropy", "entropy_start", "reward"} <= set(r) for r in run["log"])


def _se_run(method: str, seed: int, finals: float, curve: list[float]) -> dict:
    return {
        "method": method,
        "seed": seed,
        "curve": [{"rollouts": 100 * i, "sampled": y, "greedy": y} for i, y in enumerate(curve)],
        "final_full": {"sampled": finals, "greedy": finals},
        "zero_adv_rollouts": 10,
        "rollouts": 100,
    }


def test_summary_pairs_methods_by_seed(se):
    """The paired difference is taken seed by seed (runs listed in any order), and rollouts to
    target count only the seeds that reached it."""
    runs = [
        _se_run("grpo", 1, 0.50, [0.30, 0.40, 0.50]),
        _se_run("grpo", 2, 0.45, [0.30, 0.30, 0.45]),
        _se_run("grpo", 0, 0.40, [0.30, 0.35, 0.40]),
        _se_run("dynamo", 2, 0.46, [0.30, 0.30, 0.30]),
        _se_run("dynamo", 0, 0.43, [0.30, 0.40, 0.43]),
        _se_run("dynamo", 1, 0.52, [0.30, 0.40, 0.52]),
    ]
    summary = se.summarise(runs, ["grpo", "dynamo"], "sampled", 0.5)
    d = summary["methods"]["dynamo"]
    assert d["paired_final_diff"]["mean"] == pytest.approx((0.03 + 0.02 + 0.01) / 3)
    assert d["paired_final_diff"]["seeds"] == [0, 1, 2]
    # differences 0.03, 0.02, 0.01: sd 0.01 (the mean alone would not show a wrong pairing)
    half = 4.303 * 0.01 / math.sqrt(3)
    assert d["paired_final_diff"]["ci"] == pytest.approx([0.02 - half, 0.02 + half])
    # target = 0.30 + 0.5 × (0.45 − 0.30) = 0.375; dynamo seed 2 never gets there
    assert summary["target"] == pytest.approx(0.375)
    assert d["rollouts_to_target_ci"]["reached"] == 2
    assert d["rollouts_to_target_per_seed"] == [pytest.approx(75.0), pytest.approx(75.0), None]
    assert d["paired_rollouts_to_target_diff"]["seeds"] == [0, 1]


def test_no_target_when_grpo_does_not_gain(se):
    """A GRPO curve that ends below its start sets no target: nothing is "reached" at 0 rollouts."""
    runs = [
        _se_run("grpo", 0, 0.28, [0.30, 0.29, 0.28]),
        _se_run("dynamo", 0, 0.31, [0.30, 0.31, 0.31]),
    ]
    summary = se.summarise(runs, ["grpo", "dynamo"], "sampled", 0.8)
    assert summary["target"] is None
    d = summary["methods"]["dynamo"]
    assert d["rollouts_to_target"] is None and d["rollouts_to_target_per_seed"] == [None]
    assert d["rollouts_to_target_ci"]["reached"] == 0
    assert d["paired_final_diff"]["mean"] == pytest.approx(0.03)
