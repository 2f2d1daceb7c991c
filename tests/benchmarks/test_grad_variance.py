"""The gradient-variance benchmark's own logic: the batch gradient it composes from per-token
sketches (the learner step's loss and backward on the pool's log-probs) is the sketch of the same
step's gradient through the model, for both weightings; and its ``--quick`` form runs end to
end."""

from __future__ import annotations

import pytest
import torch

from tests.benchmarks.bench import bench_module, quick_report


@pytest.fixture(scope="module")
def gv():
    bench_module("sample_efficiency")
    return bench_module("grad_variance")


@pytest.fixture(scope="module")
def tiny(tiny, tiny_dir):
    """The shared tiny model (``conftest.py``) and its tokenizer, padding on the left."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.padding_side = "left"
    return tiny, tok


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


def _learner_gradient(gv, model, pool, idx, groups, agg, micro, advantage="grpo"):
    """The learner's step on the batch with the model's own forward passes (its backward, no
    optimizer step), the model's gradient then sketched."""
    model.zero_grad(set_to_none=True)
    step = gv.pool_step(agg, micro, advantage, groups, model=model)
    step(gv.pool_batch(pool, idx, groups), update=False)
    return pool["sketch"]([p.grad.unsqueeze(0) for p in pool["params"]])[0]


@pytest.mark.parametrize(
    ("agg", "advantage"),
    [("token-mean", "grpo"), ("prompt-mean", "grpo"), ("prompt-mean", "drgrpo")],
)
def test_composed_gradient_is_the_learners_backward(gv, tiny, pool, agg, advantage):
    model, _ = tiny
    p, g = pool
    idx = torch.tensor([0, 1, 1, 3, 4, 6, 8, 9, 10, 11, 11])  # unequal groups, repeats
    groups = (idx // g.pool).tolist()
    composed, _ = gv.batch_gradient(p, idx, groups, agg, g.micro_batch, advantage)
    want = _learner_gradient(gv, model, p, idx, groups, agg, g.micro_batch, advantage)
    assert float(want.norm()) > 0
    # The pool's log-probs come from one unpadded sequence at a time, the step's own forward
    # from left-padded micro-batches: float32 rounding apart (measured: 4–5e-6 of the norm).
    assert float((composed - want).norm()) <= 2e-5 * float(want.norm())


def test_weightings_differ_when_groups_are_unequal(gv, pool):
    p, g = pool
    idx = torch.tensor([0, 1, 2, 3, 3, 3, 4, 8])
    groups = (idx // g.pool).tolist()
    tm, _ = gv.batch_gradient(p, idx, groups, "token-mean", g.micro_batch)
    pm, _ = gv.batch_gradient(p, idx, groups, "prompt-mean", g.micro_batch)
    assert not torch.allclose(tm, pm)


def test_advantage_choice_changes_the_gradient(gv, pool):
    p, g = pool
    idx = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    groups = (idx // g.pool).tolist()
    std, _ = gv.batch_gradient(p, idx, groups, "prompt-mean", g.micro_batch, "grpo")
    raw, _ = gv.batch_gradient(p, idx, groups, "prompt-mean", g.micro_batch, "drgrpo")
    assert not torch.allclose(std, raw)


def test_the_recipe_range_scales_with_the_budget(gv):
    a = gv.recipe_allocator()
    # The shipped recipe itself (configs/dynamo_grpo.yaml), not the section's defaults (4..24).
    assert (a.n_per_prompt, a.n_min, a.n_max) == (16, 8, 24)
    assert gv.bounds_for(gv.ALLOCATORS["dra"], 16) == (8, 24)
    assert gv.bounds_for(gv.ALLOCATORS["dra-wl-std+hl"], 8) == (4, 12)
    assert gv.bounds_for(gv.ALLOCATORS["dra"], 4) == (2, 6)
    assert gv.bounds_for(gv.ALLOCATORS["dra"], 1) == (1, 2)
    assert gv.bounds_for(gv.ALLOCATORS["dra-wide"], 8) == (2, 16)
    assert gv.bounds_for(gv.ALLOCATORS["oracle"], 8) == (1, 16)


def _stats(k, spread, streak=None):
    import numpy as np

    return {
        "g": np.full(len(k), 16.0),
        "k": np.asarray(k, dtype=float),
        "spread": np.asarray(spread, dtype=float),
        "spread_full": np.asarray(spread, dtype=float)[::-1].copy(),
        "streak": np.zeros(len(k)) if streak is None else np.asarray(streak, dtype=float),
        "age": 0.0,
    }


def test_allocators_spend_the_budget_within_the_range(gv):
    import numpy as np

    g = gv.GVSettings(stat_samples=16)
    k = np.array([0, 0, 1, 4, 8, 12, 16, 3], dtype=float)
    stats = _stats(k, [0.0, 0.0, 1.0, 2.0, 2.0, 1.0, 0.0, 9.0], [2, 2, 0, 0, 0, 0, 1, 0])
    oracle = {
        "spread": np.array([0.0, 0.0, 1.0, 2.0, 2.0, 1.0, 0.0, 5.0]),
        "sigma": np.sqrt(k / 16 * (1 - k / 16)),
    }
    draws = np.full(k.size, 0.1)
    for name in [*gv.ALLOCATORS, "grad@8", "knapsack@stale"]:
        spec = gv.spec_of(name)[0]
        counts = gv.counts_for(name, stats, 8, k.size, g, oracle, draws=draws)
        lo, hi = gv.bounds_for(spec, 8) if spec else (8, 8)
        if name.endswith("+hl"):
            lo = g.hopeless_n
        if name.endswith("+skip"):
            lo = 0
        assert counts.sum() == 8 * k.size, name
        assert counts.min() >= lo and counts.max() <= hi, (name, counts)
    dra = gv.counts_for("dra", stats, 8, k.size, g)
    assert dra[4] == dra.max()  # p = ½ gets the most; no success, or all, the least
    assert max(dra[0], dra[1], dra[6]) < min(dra[2:6])
    # grad follows the learner's spread, grad-full the full one; the skip rule drops the streaks.
    grad = gv.counts_for("grad", stats, 8, k.size, g)
    assert grad[7] == 12 and grad[0] == grad[1] == grad[6] == 4  # n_max, n_min at B = 8
    assert gv.counts_for("grad-full", stats, 8, k.size, g)[[0, 7]].tolist() == [12, 4]
    skipped = gv.counts_for("grad+skip", stats, 8, k.size, g, draws=draws)
    # The others take what the skipped free up to n_max; only the rest goes back to the skipped.
    assert skipped[[2, 3, 4, 5, 7]].tolist() == [12] * 5 and skipped[[0, 1, 6]].sum() == 4
    # The oracles follow their own weights: the largest spread, and p = ½, get the most.
    assert gv.counts_for("oracle", stats, 8, k.size, g, oracle).argmax() == 7
    assert gv.counts_for("oracle-sigma", stats, 8, k.size, g, oracle).argmax() == 4


def test_visit_stats_are_the_learners_statistic_of_a_previous_group(gv, pool):
    import numpy as np

    from learner.algorithms.gradstats import group_grad_stats, response_grad_norms

    p, g = pool
    solved = {**p, "reward": p["reward"].clone()}
    solved["reward"][1] = 1.0  # prompt 1: every group has equal rewards
    st = gv.visit_stats(solved, g, np.random.default_rng(0), 3, 5.0)
    assert st["spread"][1] == 0.0 and st["spread_full"][1] == 0.0 and st["streak"][1] == 2.0
    assert st["age"] == 5.0 and st["g"].tolist() == [3.0] * 3
    # The same draws by hand: the learner's functions on the learner's loss coefficients.
    rng = np.random.default_rng(0)
    last = rng.integers(0, 4, (3, 3))
    idx = torch.as_tensor((np.arange(3)[:, None] * 4 + last).reshape(-1))
    groups = torch.arange(3).repeat_interleave(3)
    coef = gv.batch_coefficients(solved, idx, groups.tolist(), "prompt-mean", g.micro_batch)
    norms = response_grad_norms(coef, solved["ghost"][idx], solved["mask"][idx], 3.0)
    want = group_grad_stats(norms, groups)[2].numpy()
    assert st["spread"] == pytest.approx(want)
    assert st["k"].tolist() == solved["reward"].numpy()[np.arange(3)[:, None], last].sum(1).tolist()
    mixed = [i for i in (0, 2) if 0 < st["k"][i] < 3]
    assert all(st["spread"][i] > 0 and st["spread_full"][i] > 0 for i in mixed)
    assert not np.isnan(
        gv.visit_stats(solved, g, np.random.default_rng(0), 3, 0, False)["spread"]
    ).any()


def test_neyman_counts_follow_the_weights_within_bounds(gv):
    import numpy as np

    w = np.array([0.0, 1.0, 2.0, 4.0, 100.0])
    counts = gv.neyman_counts(w, 40, 2, 16)
    # 2 and 16 at the bounds; the other 22 as λ·(1, 2, 4) with λ = 22/7 = 3.14, 6.29, 12.57:
    # floors 3, 6, 12 and the one left to the largest remainder.
    assert counts.tolist() == [2, 3, 6, 13, 16]
    assert gv.neyman_counts(np.zeros(3), 10, 1, 8).tolist() == [4, 3, 3]
    assert gv.neyman_counts(np.ones(4), 100, 2, 8).tolist() == [8, 8, 8, 8]  # clipped total


def test_spread_against_sigma(gv):
    import numpy as np

    sigma = np.sqrt([0.0, 0.1875, 0.25, 0.1875])  # success rates 0, ¼, ½, ¾
    got = gv.spread_vs_sigma(3 * sigma, sigma)  # spread ∝ σ: perfectly told
    assert got["corr"] == pytest.approx(1.0)
    assert got["neyman_var_ratio"] == pytest.approx(sigma.sum() ** 2 / (4 * np.square(sigma).sum()))
    flat = gv.spread_vs_sigma(np.array([0.0, 1.0, 1.0, 1.0]), sigma)
    assert flat["neyman_var_ratio"] == pytest.approx(9 / 12)  # 3 of 4 prompts carry the variance
    assert np.isnan(flat["corr"])  # a constant spread has no correlation to speak of
    assert np.isnan(gv.spread_vs_sigma(np.zeros(4), sigma)["neyman_var_ratio"])


def test_gradient_spread_is_zero_only_without_signal(gv, pool):
    p, _ = pool
    solved = {**p, "reward": p["reward"].clone()}
    solved["reward"][1] = 1.0  # every sample of prompt 1 right: equal rewards in every group
    spread = gv.gradient_spread(solved, 3, gv.GVSettings(oracle_draws=6, micro_batch=5), seed=0)
    assert spread[1] == 0.0
    mixed = [i for i in (0, 2) if 0 < float(solved["reward"][i].mean()) < 1]
    assert mixed and all(spread[i] > 0 for i in mixed)


def test_summary_gives_each_sets_ratio_and_its_range(gv):
    def one(ratio, var, zero):
        case = {
            w: {"mse_ratio_to_uniform": (ratio, 0.1), "var_ratio_to_uniform": var}
            for w in gv.WEIGHTINGS
        }
        return {
            "checkpoints": {
                "warm start": {"cases": {"B4/dra": {**case, "zero_adv_share": (zero, 0.0)}}}
            }
        }

    summary = gv.summarise([one(0.9, 0.8, 0.3), one(0.7, 0.6, 0.2), one(1.1, 1.0, 0.1)])
    pm = summary["warm start"]["B4/dra"]["prompt-mean"]
    assert pm["mse_ratio"] == [0.9, 0.7, 1.1]
    assert pm["mse_ratio_range"] == [0.7, 1.1]
    assert pm["mse_ratio_mean"] == pytest.approx(0.9)
    assert pm["var_ratio_mean"] == pytest.approx(0.8)
    assert summary["warm start"]["B4/dra"]["zero_adv_share"] == [0.3, 0.2, 0.1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt-sets", "0"], "must be >= 1"),
        (["--allocators", "dra,oracle"], "must include uniform"),
        (["--allocators", "uniform,dra-fancy"], "unknown: dra-fancy"),
        (["--allocators", "uniform,oracle@8"], "unknown: oracle@8"),
        (["--advantage", "ppo"], "allowed: grpo, drgrpo, rloo"),
    ],
)
def test_bad_options_are_refused_by_name(gv, capsys, args, message):
    with pytest.raises(SystemExit):
        gv.parse(args)
    assert message in capsys.readouterr().err


def test_sketch_preserves_inner_products_on_average(gv):
    params = [torch.zeros(4000), torch.zeros(50, 20)]
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(1, 4000, generator=gen), torch.randn(1, 50, 20, generator=gen)]
    full = float(sum(t.square().sum() for t in x))
    ests = [float(gv.Sketch(params, 1024, seed=s)(x).square().sum()) for s in range(20)]
    assert sum(ests) / len(ests) == pytest.approx(full, rel=0.05)


@pytest.mark.slow
def test_quick_run_writes_the_report(gv, tmp_path):
    report = quick_report(gv, tmp_path, "gv")
    assert [st["prompt_offset"] for st in report["sets"]] == [0, 4]  # two disjoint sets of 4
    names = gv.GVSettings().allocators.split(",")
    fresh = {f"B{b}/{a}" for b in (2, 4) for a in names if not a.endswith("@stale")}
    every = {f"B{b}/{a}" for b in (2, 4) for a in names}
    want = {"warm start": fresh, "RL step 2": every}  # the warm start has no older statistics
    for st in report["sets"]:
        assert list(st["checkpoints"]) == ["warm start", "RL step 2"]
        for name, ck in st["checkpoints"].items():
            assert set(ck["cases"]) == want[name]
            for case in ck["cases"].values():
                assert 0.0 <= case["zero_adv_share"][0] <= 1.0
                assert set(case) >= {"token-mean", "prompt-mean"}
    assert list(report["summary"]) == ["warm start", "RL step 2"]
    for name, ck in report["summary"].items():
        assert set(ck) == want[name]
        for case in ck.values():
            assert len(case["prompt-mean"]["mse_ratio"]) == 2


def test_merged_visits_are_what_the_redis_scripts_store(gv, redis_url):
    """The @h statistics (``merge_visits``) equal the success counts and gradient spread the real
    Lua scripts keep for the same visits with ``stats_half_life``, so the benchmark measures the
    half-life the stores apply."""
    import numpy as np
    import redis

    from allocator.stats import StatsStore
    from dynamo_rl.contracts import gradstats
    from dynamo_rl.contracts.gradstats import GradRecord
    from dynamo_rl.keys import weight_version_key

    assert gv.spec_of("grad@h4") == (gv.ALLOCATORS["grad"], "@h4")
    assert not gv._known("oracle@h4") and not gv._known("grad@hx")
    rng = np.random.default_rng(3)
    visits = [  # the latest first
        {"g": np.full(3, 8.0), "k": rng.integers(0, 9, 3).astype(float),
         "spread": rng.uniform(0, 3, 3), "streak": np.zeros(3), "age": 4.0}
        for _ in range(4)
    ]  # fmt: skip
    merged = gv.merge_visits(visits, revisit=4, half_life=6.0)
    client = redis.Redis.from_url(redis_url)
    store = StatsStore.from_url(redis_url, half_life=6.0)
    try:
        for j, v in enumerate(reversed(visits)):  # oldest first, 4 versions apart
            client.set(weight_version_key("ns"), str(4 * j))
            store.report("ns", [(f"p{i}", 8, int(v["k"][i])) for i in range(3)])
            records = [GradRecord(f"p{i}", 0.0, float(v["spread"][i]), False) for i in range(3)]
            gradstats.write(client, "ns", 4 * j, records, half_life=6.0)
        ids = [f"p{i}" for i in range(3)]
        stored, grads = store.get("ns", ids), gradstats.read(client, "ns", ids)
    finally:
        store.close()
        client.close()
    np.testing.assert_allclose(merged["g"], stored.samples, rtol=1e-12)
    np.testing.assert_allclose(merged["k"], stored.successes, rtol=1e-12)
    np.testing.assert_allclose(merged["spread"], grads.spread, rtol=1e-12)
