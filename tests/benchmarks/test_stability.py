"""The stability benchmark's logic: its pressure (epochs, mini-batches, IS cap) is the learner
step's config; the stability verdict and the seed intervals are what the docs define; and its
``--quick`` form runs end to end."""

from __future__ import annotations

import math

import pytest

from tests.benchmarks.bench import bench_module, quick_report


@pytest.fixture(scope="module")
def se():
    return bench_module("sample_efficiency")


@pytest.fixture(scope="module")
def stab(se):
    return bench_module("stability")


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


def test_the_pressure_reaches_the_learner_step_as_its_config(se, stab):
    """Epochs, mini-batches and the IS cap are the learner's ppo_epochs, mini_batch_size (whole
    groups) and is_cap: the step itself runs them (``tests/learner/test_step.py``)."""
    s, st = se.Settings(batch_size=16), stab.StabSettings(epochs=2, mini_batches=3, is_cap=2.0)
    lc = se.learner_config(s, stab.algo_for("mod", s, st), groups=16, lr=3e-4, epochs=st.epochs,
                           mini_batches=st.mini_batches)  # fmt: skip
    assert (lc.ppo_epochs, lc.mini_batch_size, lc.train_batch_size, lc.lr) == (2, 6, 16, 3e-4)
    assert lc.algorithm.is_cap == 2.0 and lc.algorithm.modulation.enabled
    assert lc.micro_batch_size == s.micro_batch and lc.optim.grad_clip == s.grad_clip
    assert stab.algo_for("grpo", s, stab.StabSettings(is_cap=0.0)).is_cap is None


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
