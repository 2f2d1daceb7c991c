"""Default routes for verl's data-source names, through a real reward service.

Items carry only what a verl parquet row gives (``data_source``, the response, the ground truth);
the route of the data source decides how they are scored. One hand-made case per route, each
chosen so that another extraction would score it differently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dynamo_rl.config import ConfigError, load_config
from dynamo_rl.config.reward import DEFAULT_ROUTES, RewardConfig
from dynamo_rl.contracts.reward import CodeItem, MathItem
from services.reward.routes import Routes
from services.rollout.datasets import DatasetError, record_from_row, reward_item
from tests.services.reward.conftest import RewardServer, configured_reward_server

GSM8K_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
TWO_BOXES = "The roots are \\boxed{2} and \\boxed{3}."


def math(reward: RewardServer, source: str, response: str, truth: str, **kw: Any) -> dict:
    item = {"kind": "math", "data_source": source, "response": response, "ground_truth": truth}
    return reward.one({**item, **kw})


def test_gsm8k_reference_solution_scores_correct_and_a_changed_number_wrong(
    reward: RewardServer,
) -> None:
    res = math(reward, "openai/gsm8k", GSM8K_SOLUTION, "72")
    assert (res["correct"], res["reason"]) == (True, "ok"), res
    res = math(reward, "openai/gsm8k", GSM8K_SOLUTION.replace("#### 72", "#### 73"), "72")
    assert (res["correct"], res["reason"]) == (False, "wrong_answer"), res
    # Without the route the same text has no boxed answer and no 'Answer:' line.
    assert math(reward, "my_gsm", GSM8K_SOLUTION, "72")["reason"] == "no_answer"


def test_gsm8k_numbers_are_normalised_and_strict_needs_the_hashes(reward: RewardServer) -> None:
    assert math(reward, "openai/gsm8k", "It costs\n#### $1,234", "1234")["correct"]
    # A whole solution as the ground truth counts by its '#### N'.
    assert math(reward, "openai/gsm8k", "#### 18", "So 9 + 9 = 18.\n#### 18")["correct"]
    assert math(reward, "openai/gsm8k", "#### 72.0", "72")["correct"]
    res = math(reward, "openai/gsm8k", "The answer is 72.", "72")
    assert (res["correct"], res["reason"]) == (False, "no_answer")
    # The item's own extraction wins over the route: the flexible mode takes the last number.
    res = math(reward, "openai/gsm8k", "The answer is 72.", "72", extraction="gsm8k_flexible")
    assert res["correct"], res
    res = math(reward, "openai/gsm8k", "Not 72: I got 7", "72", extraction="gsm8k_flexible")
    assert not res["correct"]
    assert math(reward, "openai/gsm8k", "\\boxed{72}", "72", extraction="last_boxed")["correct"]


@pytest.mark.parametrize(
    "source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]
)
def test_math_sources_take_the_last_box(reward: RewardServer, source: str) -> None:
    assert math(reward, source, TWO_BOXES, "3")["correct"]  # math_verify would read "2, 3"
    assert not math(reward, source, TWO_BOXES, "2")["correct"]


@pytest.mark.parametrize("source", ["math_dapo", "aime_2024", "aime25"])
def test_dapo_and_aime_take_the_answer_line(reward: RewardServer, source: str) -> None:
    assert math(reward, source, "Work...\nAnswer: 34", "34")["correct"]
    assert not math(reward, source, "Work...\nAnswer: 35", "34")["correct"]
    assert math(reward, source, "Work... \\boxed{34}", "34")["reason"] == "no_answer"


def test_numina_sources_read_delimited_answers_as_math_verify_does(reward: RewardServer) -> None:
    for source in ("numina_olympiads", "numina_cn_k12"):
        assert math(reward, source, "Thus $x = \\frac{1}{2}$.", "0.5")["correct"]
        assert math(reward, source, TWO_BOXES, "2, 3")["correct"]  # both boxes combined


@pytest.mark.parametrize("source", ["codecontests", "apps", "codeforces", "taco"])
def test_code_sources_run_verl_test_cases_in_the_sandbox(reward: RewardServer, source: str) -> None:
    """A verl code row (tests as JSON inputs/outputs in the ground truth) scored as its route says:
    the fraction of passed cases."""
    cases = {"inputs": ["1\n", "5\n"], "outputs": ["2\n", "7\n"]}
    row = {"prompt": "Add one.", "ability": "code", "data_source": source,
           "reward_model": {"ground_truth": json.dumps(cases)}}  # fmt: skip
    record = record_from_row(row, 0)
    item = reward_item(record, "c", "```python\nprint(int(input()) + 1)\n```")
    (res,) = reward.verify(item.model_dump(mode="json", exclude_unset=True))
    assert (res["score"], res["reason"]) == (0.5, "wrong_answer"), res


def test_call_based_verl_code_rows_are_scored_by_calling_the_function(
    reward: RewardServer,
) -> None:
    """APPS/TACO call-based rows (fn_name): one call per case, a function or a Solution method,
    outputs compared as JSON (APPS wraps a return value in a one-element list)."""
    cases = {"fn_name": "add", "inputs": [[1, 2], [[1], [2, 3]], [5, 5]],
             "outputs": [[3], [[1, 2, 3]], [11]]}  # fmt: skip
    row = {"prompt": "Write add.", "ability": "code", "data_source": "apps",
           "reward_model": {"ground_truth": json.dumps(cases)}}  # fmt: skip
    record = record_from_row(row, 0)
    assert record.reward_extra["tests"]["type"] == "call"
    responses = {
        "function": "```python\ndef add(a, b):\n    return a + b\n```",
        "method": "class Solution:\n    def add(self, a, b):\n        return a + b\n",
        "fake": "import os\nprint('3')\nos._exit(0)\ndef add(a, b):\n    return a + b\n",
        "missing": "def plus(a, b):\n    return a + b\n",
    }
    items = [reward_item(record, k, v).model_dump(mode="json", exclude_unset=True)
             for k, v in responses.items()]  # fmt: skip
    by_id = {r["id"]: r for r in reward.verify(*items)}
    # Case 3 expects 11 from 5 + 5: two of three pass.
    assert by_id["function"]["score"] == pytest.approx(2 / 3), by_id["function"]
    assert "case 2: wrong_answer" in by_id["function"]["detail"]
    assert by_id["method"]["score"] == pytest.approx(2 / 3), by_id["method"]
    # A program that prints an answer and leaves before the call returns passes nothing.
    assert (by_id["fake"]["score"], by_id["fake"]["reason"]) == (0.0, "wrong_answer")
    assert by_id["missing"]["reason"] == "runtime_error"


def test_call_tests_are_python_only() -> None:
    row = {"prompt": "q", "ability": "code", "language": "cpp",
           "tests": {"fn_name": "f", "inputs": [[1]], "outputs": [1]}}  # fmt: skip
    with pytest.raises(DatasetError, match="only supported with language 'python'"):
        record_from_row(row, 0)


@pytest.fixture(scope="module")
def overridden(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    logs = tmp_path_factory.mktemp("routes")
    config = {
        "reward": {
            "routes": {
                "openai/gsm8k": None,  # removes the default route
                "apps": {"scoring": "all_or_nothing"},  # merged over the default
                "mine/*": {"kind": "math", "extraction": "gsm8k_flexible"},
                "mine/exact": {"kind": "math", "extraction": "gsm8k"},
            },
            "composite": {"mine/composite": {"components": [{"kind": "math"}]}},
        }
    }
    with configured_reward_server(logs, config) as server:
        yield server


def test_routes_are_overridable_per_source(overridden: RewardServer) -> None:
    assert math(overridden, "openai/gsm8k", GSM8K_SOLUTION, "72")["reason"] == "no_answer"
    assert math(overridden, "mine/any", "I count 72.", "72")["correct"]
    assert math(overridden, "mine/exact", "I count 72.", "72")["reason"] == "no_answer"
    # A composite spec's math component scores with the route's extraction.
    res = math(overridden, "mine/composite", "I count 72.", "72")
    assert res["correct"] and res["components"] == {"math": 1.0}, res
    half = {
        "type": "stdio",
        "cases": [{"stdin": "1", "stdout": "2"}, {"stdin": "5", "stdout": "7"}],
    }
    res = overridden.one({"kind": "code", "data_source": "apps", "tests": half,
                          "response": "print(int(input()) + 1)"})  # fmt: skip
    assert res["score"] == 0.0 and res["reason"] == "wrong_answer"
    # Still the default for other code sources, and an item's own scoring wins.
    res = overridden.one({"kind": "code", "data_source": "taco", "tests": half,
                          "response": "print(int(input()) + 1)"})  # fmt: skip
    assert res["score"] == 0.5
    res = overridden.one({"kind": "code", "data_source": "apps", "tests": half,
                          "scoring": "fraction", "response": "print(int(input()) + 1)"})  # fmt: skip
    assert res["score"] == 0.5


def test_route_config_defaults_merge_and_lookup() -> None:
    cfg = RewardConfig()
    assert set(cfg.routes) == set(DEFAULT_ROUTES)
    routes = Routes(cfg.routes)
    assert routes.find("aime_2024") == ("aime*", cfg.routes["aime*"])
    assert routes.find("openai/gsm8k") == ("openai/gsm8k", cfg.routes["openai/gsm8k"])
    assert routes.find("gsm8k") is None and routes.find(None) is None
    cfg = load_config(overrides=["reward.routes.aime*.extraction=last_boxed",
                                 "reward.routes.aime_2024={kind: math, extraction: math_verify}",
                                 "reward.routes.numina_*=null"]).reward  # fmt: skip
    routes = Routes(cfg.routes)
    assert cfg.routes["aime*"] is not None and cfg.routes["aime*"].extraction == "last_boxed"
    assert routes.find("aime_2024")[1].extraction == "math_verify"  # type: ignore[index]
    assert routes.find("aime25")[1].extraction == "last_boxed"  # type: ignore[index]
    assert routes.find("numina_olympiads") is None
    # A dumped config loads back to the same routes (a removed default stays removed).
    again = RewardConfig.model_validate(cfg.model_dump(mode="json"))
    assert again.routes == cfg.routes
    with pytest.raises(ConfigError, match="extraction is for kind 'math'"):
        load_config(overrides=["reward.routes.apps.extraction=gsm8k"])
    with pytest.raises(ConfigError, match=r"reward\.routes\.x"):
        load_config(overrides=["reward.routes.x={kind: poem}"])


def test_first_unrouted_names_each_uncovered_math_source_once() -> None:
    routes = Routes(RewardConfig().routes)

    def math(source: str | None, extraction: str | None = None) -> MathItem:
        return routes.apply(MathItem(id="0", kind="math", data_source=source, response="r",
                                     ground_truth="1", extraction=extraction))  # fmt: skip

    assert routes.first_unrouted(math("my_set")) == "my_set"
    assert routes.first_unrouted(math("my_set")) is None  # once per source
    assert routes.first_unrouted(math("other_set")) == "other_set"
    assert routes.first_unrouted(math("aime_2024")) is None  # a route fills the extraction in
    assert routes.first_unrouted(math("third_set", "answer_line")) is None  # the item names one
    assert routes.first_unrouted(math(None)) is None  # no name to report
    code = CodeItem(id="1", kind="code", data_source="fourth_set", response="",
                    tests={"type": "stdio", "cases": [{"stdin": "", "stdout": ""}]})  # fmt: skip
    assert routes.first_unrouted(routes.apply(code)) is None  # code has no extraction to miss
