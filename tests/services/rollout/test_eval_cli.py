"""``dynamo-rl eval --model``: a real engine and reward service of its own, real samples."""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO, dynamo_rl_argv


def _eval(model: Path, data: Path, out: Path, samples: Path) -> dict:
    argv = dynamo_rl_argv(
        "eval", "--model", str(model), "--data", str(data), "--n", "3", "--temperature", "1.0",
        "--out", str(out), "--samples", str(samples), "run.seed=5",
        "rollout.sampling.max_tokens=6",
    )  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_eval_samples_each_prompt_with_its_own_seed_and_reports_what_it_scored(
    tmp_path: Path,
) -> None:
    from learner.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1)  # fmt: skip
    # The same question under 12 ids: with one seed shared by every prompt, each would get the
    # very same samples (the bias that made `up`'s sampled accuracy depend on a few noise streams).
    data = tmp_path / "data.jsonl"
    # Two difficulty tiers, as the arith task marks them (extra_info.tier): reported per tier.
    rows = [{"id": f"q{i}", "prompt": "1+1=", "ground_truth": "2",
             "extra_info": {"tier": "easy" if i < 4 else "hard"}} for i in range(12)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    result = _eval(model, data, tmp_path / "a.json", tmp_path / "a.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert len(lines) == 12 * 3
    by_prompt: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        by_prompt[line["prompt_id"]].append(line["text"])
    assert sorted(by_prompt) == sorted(r["id"] for r in rows)
    assert len({tuple(v) for v in by_prompt.values()}) > 1, "every prompt got the same samples"
    # The reported accuracy is the mean of the verdicts written.
    assert result["accuracy"] == pytest.approx(sum(x["correct"] for x in lines) / len(lines))
    assert result["prompts"] == 12 and result["n"] == 3
    tier_of = {r["id"]: r["extra_info"]["tier"] for r in rows}
    (bench,) = result["benchmarks"].values()
    for tier, count in (("easy", 4), ("hard", 8)):
        mine = [x["correct"] for x in lines if tier_of[x["prompt_id"]] == tier]
        assert bench["by_tier"][tier]["prompts"] == count
        assert bench["by_tier"][tier]["accuracy"] == pytest.approx(sum(mine) / len(mine))

    # Seeded: the same command gives the same samples.
    _eval(model, data, tmp_path / "b.json", tmp_path / "b.jsonl")
    assert (tmp_path / "b.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()


@pytest.mark.slow
def test_eval_on_two_benchmarks_prints_one_table_and_records_how_it_sampled(
    tmp_path: Path,
) -> None:
    """Two converted benchmark files in one call: a table row each, figures that agree with the
    samples written (avg@n their mean, pass@k the share of k-subsets holding a correct sample),
    the sampling settings and the prompt template in the JSON."""
    import itertools

    from learner.tiny_model import build_tiny_model
    from tasks.convert import FORMATS, convert_rows, write_rows

    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1)  # fmt: skip
    gsm = [{"question": f"{a}+{a}=", "answer": f"#### {2 * a}"} for a in range(6)]
    aime = [{"id": i, "problem": f"{i}*1=", "answer": str(i)} for i in range(5)]
    files = {}
    for name, fmt, rows in (("gsm8k", "gsm8k", gsm), ("aime", "aime2024", aime)):
        converted, _ = convert_rows(FORMATS[fmt], rows)
        files[name] = write_rows(converted, tmp_path / f"{name}.parquet")
    out, samples = tmp_path / "eval.json", tmp_path / "samples.jsonl"
    argv = dynamo_rl_argv(
        "eval", "--model", str(model), "--data", str(files["gsm8k"]), f"AIME={files['aime']}",
        "--n", "4", "--k", "1,2,4", "--temperature", "1.0", "--bootstrap", "200", "--out",
        str(out), "--samples", str(samples), "run.seed=3", "rollout.sampling.max_tokens=8",
    )  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout.splitlines()
    assert table[0].split() == ["benchmark", "prompts", "avg@4", "pass@1", "pass@2", "pass@4",
                                "maj@4"]  # fmt: skip
    assert table[2].split()[:2] == ["gsm8k", "6"] and table[3].split()[:2] == ["AIME", "5"]
    result = json.loads(out.read_text())
    assert list(result["benchmarks"]) == ["gsm8k", "AIME"] and result["prompts"] == 11
    lines = [json.loads(x) for x in samples.read_text().splitlines()]
    for name, bench in result["benchmarks"].items():
        by_prompt: dict[str, list[bool]] = defaultdict(list)
        for line in lines:
            if line["benchmark"] == name:
                by_prompt[line["prompt_id"]].append(line["correct"])
        assert len(by_prompt) == bench["prompts"]
        m = bench["metrics"]
        flat = [c for v in by_prompt.values() for c in v]
        assert m["avg@4"]["mean"] == pytest.approx(sum(flat) / len(flat))
        for k in (1, 2, 4):
            share = [
                sum(any(s) for s in itertools.combinations(v, k))
                / len(list(itertools.combinations(v, k)))
                for v in by_prompt.values()
            ]
            assert m[f"pass@{k}"]["mean"] == pytest.approx(sum(share) / len(share))
            lo, hi = m[f"pass@{k}"]["ci"]
            assert lo <= m[f"pass@{k}"]["mean"] <= hi
        assert m["maj@4"] is None or 0.0 <= m["maj@4"]["mean"] <= 1.0
    gsm_prompt = result["benchmarks"]["gsm8k"]["example_prompt"]
    assert '"####"' in gsm_prompt and "Answer:" in result["benchmarks"]["AIME"]["example_prompt"]
    s = result["sampling"]
    assert (s["n"], s["temperature"], s["max_tokens"]) == (4, 1.0, 8)
    assert result["prompt_template"]["setting"] == "auto"
    assert result["bootstrap"] == {"resamples": 200, "seed": 3, "confidence": 0.95}


def test_benchmarks_are_named_by_file_or_given_names() -> None:
    from services.rollout.eval_cli import benchmark_files

    got = benchmark_files(["data/gsm8k.parquet", "AIME=x/aime.parquet", "math/test.parquet",
                           "code/test.parquet"])  # fmt: skip
    assert got == {"gsm8k": "data/gsm8k.parquet", "AIME": "x/aime.parquet",
                   "math/test": "math/test.parquet", "code/test": "code/test.parquet"}  # fmt: skip
    with pytest.raises(ValueError, match="two benchmarks named 'A'"):
        benchmark_files(["A=a.jsonl", "A=b.jsonl"])


def test_eval_refuses_a_k_above_the_samples_before_starting_anything(tmp_path: Path) -> None:
    argv = dynamo_rl_argv("eval", "--model", str(tmp_path / "none"), "--data", "x.jsonl",
                          "--n", "4", "--k", "1,8")  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--k: each k must be in 1..4" in done.stderr, done.stderr


def test_overrides_after_the_data_files_are_overrides(tmp_path: Path) -> None:
    from services.rollout.eval_cli import is_override

    assert is_override("run.seed=1") and is_override("rollout.sampling.max_tokens=8")
    assert not is_override("AIME=aime.parquet") and not is_override("data/x.v2=y.jsonl")
    # --data is greedy: the override after the files reaches the config (and is refused there).
    argv = dynamo_rl_argv("eval", "--model", str(tmp_path / "none"), "--data", "a.jsonl",
                          "b.jsonl", "rollout.batch_size=0")  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "rollout.batch_size" in done.stderr, done.stderr


@pytest.mark.slow
def test_eval_plays_episodes_when_an_environment_is_set(tmp_path: Path) -> None:
    """With ``rollout.env`` set, each sample is an episode played as the worker plays it (here
    guess_number: a random tiny model keeps getting feedback until max_turns), its final turn
    scored; the result says what the episodes did."""
    from learner.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2,
                             num_kv_heads=1)  # fmt: skip
    data = tmp_path / "data.jsonl"
    rows = [{"id": f"g{i}", "prompt": "guess", "ground_truth": str(40 + i)} for i in range(5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, samples = tmp_path / "eval.json", tmp_path / "samples.jsonl"
    argv = dynamo_rl_argv(
        "eval", "--model", str(model), "--data", str(data), "--n", "2", "--out", str(out),
        "--samples", str(samples), "rollout.sampling.max_tokens=4", "rollout.env.name=guess_number",
        "rollout.env.max_turns=3",
    )  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    done_s = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    bench = json.loads(out.read_text())["benchmarks"]["data"]
    episodes = bench["episodes"]
    assert episodes["env"] == "guess_number" and episodes["episodes"] == 10
    lines = [json.loads(x) for x in samples.read_text().splitlines()]
    turns = [len(x["text"].split(" | ")) for x in lines]  # each sample: its turns' texts
    assert episodes["turns_mean"] == pytest.approx(sum(turns) / len(turns))
    assert episodes["turns_mean"] > 1.5  # feedback came back and the episodes went on
    assert episodes["tool_call_rate"] == 0.0 and episodes["dropped"] == 0
    assert bench["accuracy"] == pytest.approx(sum(x["correct"] for x in lines) / len(lines))
    # Throughput: the 10 episodes over the time they took.
    assert 0 < episodes["wall_s"] < done_s
    assert episodes["episodes_per_second"] == pytest.approx(10 / episodes["wall_s"], rel=1e-2)


def test_episode_summary_counts_calls_errors_and_turns() -> None:
    from services.rollout.eval_metrics import episode_summary

    stats = [
        {"turns": 2, "tool_calls": 1, "tool_errors": 0, "dropped": False},
        {"turns": 3, "tool_calls": 2, "tool_errors": 1, "dropped": False},
        {"turns": 1, "tool_calls": 0, "tool_errors": 0, "dropped": True},
        {"turns": 1, "tool_calls": 0, "tool_errors": 0, "dropped": False},
    ]
    s = episode_summary(stats, "tools")
    assert s == {
        "env": "tools",
        "episodes": 4,
        "turns_mean": 1.75,
        "tool_call_rate": 0.5,
        "tool_calls_mean": 0.75,
        "tool_error_rate": pytest.approx(1 / 3),  # of the 3 calls, not of the 4 episodes
        "dropped": 1,
    }
    assert episode_summary([], "tools")["tool_error_rate"] == 0.0
