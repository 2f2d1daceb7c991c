"""Parity with verl's ``default_compute_score``, through a real reward service.

Items are sent as a verl row arrives: a ``data_source``, the response, the ground truth, no
extraction named, so the source's default route decides. Every source name verl routes gets a
right answer (scores 1) and a wrong one (scores 0), in the answer forms verl's scorer for it
accepts; sentences with "answer" in them that name a wrong number are refused, and the
undelimited-answer parse never turns a formula into one of its numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dynamo_rl.config.reward import SEARCH_R1_SETS, RewardConfig
from services.reward.routes import Routes
from services.rollout.datasets import record_from_row, reward_item
from tests.services.reward.conftest import RewardServer, configured_reward_server

# Every name verl's default_compute_score knows, by the scorer it sends the name to.
GSM8K = ["openai/gsm8k"]
MATH = ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]
DAPO = ["math_dapo", "math", "math_dapo_reasoning", "aime_2024", "aime25"]  # and every aime*
NUMINA = ["numina_aops_forum", "numina_synthetic_math", "numina_amc_aime",
          "numina_synthetic_amc", "numina_cn_k12", "numina_olympiads"]  # fmt: skip
CODE = ["codecontests", "apps", "codeforces", "taco"]
GEO3K = ["hiyouga/geometry3k"]
SEARCH_R1 = [f"searchR1_{name}" for name in SEARCH_R1_SETS]
VERL_SOURCES = GSM8K + MATH + DAPO + NUMINA + CODE + GEO3K + SEARCH_R1

MATRIX = r"\begin{pmatrix} 1 & 2 \\ 3 & 19 \end{pmatrix}"


def math(reward: RewardServer, source: str, response: str, truth: str) -> dict[str, Any]:
    return reward.one(
        {"kind": "math", "data_source": source, "response": response, "ground_truth": truth}
    )


def scores(reward: RewardServer, source: str, truth: str, *responses: str) -> list[float]:
    items = [{"id": i, "kind": "math", "data_source": source, "response": r, "ground_truth": truth}
             for i, r in enumerate(responses)]  # fmt: skip
    return [r["score"] for r in reward.verify(*items)]


def test_every_verl_source_name_has_a_route_of_its_scorer() -> None:
    routes = Routes(RewardConfig().routes)
    expected = {
        **{s: ("math", "gsm8k") for s in GSM8K},
        **{s: ("math", "last_boxed") for s in MATH + GEO3K},
        **{s: ("math", "answer_line") for s in [*DAPO, "aime", "aime_2025_ii"]},
        **{s: ("math", "whole_response") for s in NUMINA},
        **{s: ("math", "qa_exact_match") for s in SEARCH_R1},
        **{s: ("code", None) for s in CODE},
    }
    for source, (kind, extraction) in expected.items():
        found = routes.find(source)
        assert found is not None, source
        route = found[1]
        assert (route.kind, route.extraction) == (kind, extraction), source
        assert route.first_cases is None  # ours, every case, is the default
    assert len(SEARCH_R1) == 7 and set(expected) >= set(VERL_SOURCES)


@pytest.mark.parametrize("source", GSM8K)
def test_gsm8k_right_and_wrong(reward: RewardServer, source: str) -> None:
    assert scores(reward, source, "72", "so 72\n#### 72", "so 73\n#### 73") == [1.0, 0.0]


@pytest.mark.parametrize("source", MATH + GEO3K)
def test_boxed_sources_right_and_wrong(reward: RewardServer, source: str) -> None:
    right = r"<think>2+2=4, 4\cdot\frac{1}{4}</think> So the answer is \boxed{\frac{\sqrt{3}}{2}}."
    wrong = right.replace(r"\sqrt{3}", r"\sqrt{2}")
    assert scores(reward, source, r"\frac{\sqrt3}{2}", right, wrong) == [1.0, 0.0]


ANSWER_PHRASINGS = [
    "Work...\nAnswer: {}",
    "Therefore, the final answer: {}",
    "Work... so the answer is: {}.",
    "**Final Answer:** ${}$",
    "Work\nFinal answer: {}\n\nI hope this helps.",
]


@pytest.mark.parametrize("source", DAPO)
@pytest.mark.parametrize("phrasing", ANSWER_PHRASINGS)
def test_dapo_sources_read_answer_anywhere_on_a_line_that_ends_with_it(
    reward: RewardServer, source: str, phrasing: str
) -> None:
    assert scores(reward, source, "34", phrasing.format(34), phrasing.format(35)) == [1.0, 0.0]


def test_dapo_answers_are_compared_by_math_verify_not_as_strings(reward: RewardServer) -> None:
    """docs/data.md's example: verl's string comparison gives 0 here, math-verify 1."""
    assert scores(reward, "math_dapo", r"\frac{1}{2}", "Answer: 0.5", "Answer: 0.25") == [1.0, 0.0]


REFUSED_SENTENCES = [
    "If the answer: 12 were right, the sum would be odd. Recounting, it is 13.",
    "The answer: 12 is what I first thought, but the carry makes it 13.",
    "Final Answer: $12$ was a slip, so we continue",
    "Answer: 13\nMy first answer: 12 is wrong because I dropped a term.",
]


@pytest.mark.parametrize("source", ["math_dapo", "lighteval/MATH", "numina_cn_k12"])
@pytest.mark.parametrize("response", REFUSED_SENTENCES)
def test_a_sentence_with_answer_in_it_naming_a_wrong_number_is_refused(
    reward: RewardServer, source: str, response: str
) -> None:
    """The number after 'answer:' is 12, the ground truth is 12, but the line goes on: 12 was not
    given as the answer, so it does not score."""
    res = math(reward, source, response, "12")
    assert (res["score"], res["reason"]) == (0.0, "no_answer"), res
    assert "goes on after its answer" in res["detail"]


UNDELIMITED = [
    (MATRIX, MATRIX, r"\begin{pmatrix} 1 & 2 \\ 3 & 18 \end{pmatrix}"),
    (r"\frac{1+\sqrt{5}}{2}", r"\frac{1+\sqrt{5}}{2}", r"\frac{1-\sqrt{5}}{2}"),
    ("x^2 + 3x + 5", "x^2+3x+5", "x^2 + 3x + 6"),
    ("(2, 3)", "(2,3)", "(2, 4)"),
    ("The answer is 42.", "42", "The answer is 41."),
]


@pytest.mark.parametrize("source", NUMINA)
@pytest.mark.parametrize(("right", "truth", "wrong"), UNDELIMITED)
def test_numina_sources_parse_an_undelimited_response_whole(
    reward: RewardServer, source: str, right: str, truth: str, wrong: str
) -> None:
    assert scores(reward, source, truth, right, wrong) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        (MATRIX, "19"),  # a right matrix is not its last number
        ("x^2 + 3x + 5", "5"),  # a polynomial is not its constant
        (r"2\sqrt{3}", "2"),
        ("I added 2 and 3 to get 5", "3"),  # words with several numbers: no number is the answer
        ("The answer is 5, since 2 + 3 = 5", "3"),
    ],
)
def test_the_last_number_fallback_never_accepts_a_number_of_a_formula(
    reward: RewardServer, response: str, truth: str
) -> None:
    res = math(reward, "numina_olympiads", response, truth)
    assert res["score"] == 0.0, res


def test_numina_delimited_answers_are_read_by_math_verify(reward: RewardServer) -> None:
    both = r"The roots are \boxed{2} and \boxed{3}."
    assert scores(reward, "numina_cn_k12", "2, 3", both, both.replace("{3}", "{4}")) == [1.0, 0.0]
    assert scores(reward, "numina_amc_aime", "0.5", "Thus $x = \\frac{1}{2}$.", "$x = 2$") == [
        1.0,
        0.0,
    ]


def search_r1_item(source: str, response: str, targets: list[str]) -> dict[str, Any]:
    """A verl Search-R1 row (ground truth ``{"target": [...]}``, ability "fact-reasoning") made
    into a reward item by the dataset loader."""
    row = {"prompt": [{"role": "user", "content": "Who?"}], "data_source": source,
           "ability": "fact-reasoning", "reward_model": {"ground_truth": {"target": targets}},
           "extra_info": {"index": 3}}  # fmt: skip
    record = record_from_row(row, 0)
    return reward_item(record, "q", response).model_dump(mode="json", exclude_unset=True)


@pytest.mark.parametrize("source", SEARCH_R1)
def test_search_r1_sources_score_normalised_exact_match(reward: RewardServer, source: str) -> None:
    targets = ["Eiffel Tower", "La tour Eiffel"]
    responses = {
        "right": "<think>Paris...</think><answer>the eiffel  tower!</answer>",
        "alias": "<answer>Louvre</answer> no, <answer>La Tour Eiffel.</answer>",  # the last one
        "wrong": "<answer>The Louvre</answer>",
        "longer": "<answer>Eiffel Tower in Paris</answer>",  # exact match, not containment
        "untagged": "The Eiffel Tower",
    }
    results = reward.verify(*(search_r1_item(source, r, targets) for r in responses.values()))
    got = {name: (r["score"], r["reason"]) for name, r in zip(responses, results, strict=True)}
    assert got == {
        "right": (1.0, "ok"),
        "alias": (1.0, "ok"),
        "wrong": (0.0, "wrong_answer"),
        "longer": (0.0, "wrong_answer"),
        "untagged": (0.0, "no_answer"),
    }


def test_search_r1_spamming_answer_tags_scores_nothing(reward: RewardServer) -> None:
    spam = "<answer>a</answer>" * 11 + "<answer>Eiffel Tower</answer>"
    res = reward.one({k: v for k, v in search_r1_item("searchR1_nq", spam, ["Eiffel Tower"]).items()
                      if k != "id"})  # fmt: skip
    assert (res["score"], res["reason"]) == (0.0, "wrong_answer"), res


LEETCODE_ROW = {
    "prompt": "Group the numbers by their remainder mod k; return the group sizes.",
    "ability": "code",
    "data_source": "codeforces",
    "reward_model": {
        "ground_truth": json.dumps({
            "fn_name": "groupSizes",
            "inputs": ["[1, 2, 3, 4, 5]\n2", "[3, 6, 9]\n3", "[]\n4", "[7]\n5"],
            "outputs": ["[3, 2]", "[3]", "[]", "[1]"],
        })
    },
}  # fmt: skip
# Uses List and defaultdict without importing them, as LeetCode solutions do.
LEETCODE_RIGHT = """```python
class Solution:
    def groupSizes(self, nums: List[int], k: int) -> List[int]:
        groups = defaultdict(int)
        for x in nums:
            groups[x % k] += 1
        return [groups[r] for r in sorted(groups, key=lambda r: (r != 1, r))]
```"""


def leetcode_items(*responses: str) -> list[dict[str, Any]]:
    record = record_from_row(LEETCODE_ROW, 0)
    return [reward_item(record, str(i), r).model_dump(mode="json", exclude_unset=True)
            for i, r in enumerate(responses)]  # fmt: skip


def test_call_based_rows_with_json_line_arguments_and_no_imports(reward: RewardServer) -> None:
    """verl's LeetCode-style layout: fn_name, each input one JSON argument per line, each output
    the return value's text; the usual imports come before the program; outputs are values."""
    (item,) = leetcode_items("")
    assert item["tests"]["cases"][0] == {
        "args": [[1, 2, 3, 4, 5], 2], "expected": [3, 2], "expected_text": "[3, 2]",
    }  # fmt: skip
    future = "from __future__ import annotations\n" + LEETCODE_RIGHT.strip("`").removeprefix(
        "python\n"
    )
    wrong = LEETCODE_RIGHT.replace("groups[x % k] += 1", "groups[x % k] = 1")
    top_level = "def groupSizes(nums: List[int], k: int) -> List[int]:\n    return [3, 2]\n"
    by_id = {r["id"]: r for r in reward.verify(*leetcode_items(LEETCODE_RIGHT, future, wrong,
                                                                top_level))}  # fmt: skip
    assert (by_id["0"]["score"], by_id["0"]["reason"]) == (1.0, "ok"), by_id["0"]
    assert by_id["1"]["score"] == 1.0, by_id["1"]  # a __future__ import stays first
    assert by_id["2"]["score"] == pytest.approx(2 / 4), by_id["2"]  # [1, 1] and [1] differ
    assert by_id["3"]["score"] == pytest.approx(1 / 4), by_id["3"]


def test_an_imported_name_is_not_the_programs_function(reward: RewardServer) -> None:
    """The imports bring in operator.add; a program that defines no ``add`` gets no credit."""
    tests = {"type": "call", "fn_name": "add", "cases": [{"args": [1, 2], "expected": 3}]}
    res = reward.one({"kind": "code", "response": "x = 1", "tests": tests})
    assert (res["score"], res["reason"]) == (0.0, "runtime_error"), res
    res = reward.one({"kind": "code", "response": "def add(a, b):\n    return a + b",
                      "tests": tests})  # fmt: skip
    assert res["score"] == 1.0, res


def test_a_string_return_value_matches_the_expected_text(reward: RewardServer) -> None:
    row = {**LEETCODE_ROW, "reward_model": {"ground_truth": json.dumps(
        {"fn_name": "f", "inputs": ["5"], "outputs": ["5"]})}}  # fmt: skip
    record = record_from_row(row, 0)
    items = [reward_item(record, str(i), r).model_dump(mode="json", exclude_unset=True)
             for i, r in enumerate(["def f(n):\n    return str(n)", "def f(n):\n    return n",
                                    "def f(n):\n    return '6'"])]  # fmt: skip
    assert [r["score"] for r in reward.verify(*items)] == [1.0, 1.0, 0.0]


HALF = {"type": "stdio", "cases": [{"stdin": str(i), "stdout": str(i + 1)} for i in range(12)]}
# Right on the first ten cases, wrong on the last two: verl's continuous score is 1.0, ours 10/12.
TEN_RIGHT = "n = int(input())\nprint(n + 1 if n < 10 else 0)"


def test_partial_credit_on_the_first_cases_is_an_option_all_cases_the_default(
    reward: RewardServer,
) -> None:
    item = {"kind": "code", "data_source": "codecontests", "response": TEN_RIGHT, "tests": HALF}
    res = reward.one(item)
    assert res["score"] == pytest.approx(10 / 12) and res["detail"].startswith("passed 10/12;")
    res = reward.one({**item, "first_cases": 10})
    assert (res["score"], res["reason"]) == (1.0, "ok"), res
    assert res["detail"] == "passed 10/10 (the first 10 of 12 cases)"
    res = reward.one({**item, "first_cases": 11})
    assert res["score"] == pytest.approx(10 / 11) and "of 12 cases" in res["detail"]


@pytest.fixture(scope="module")
def verl_like(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    """A server configured as docs/data.md tells a verl user to: verl's first-ten-cases partial
    credit for the code sources, and geo3k's 0.9 * answer + 0.1 * format reward."""
    logs = tmp_path_factory.mktemp("verl_like")
    config = {
        "reward": {
            "routes": {source: {"first_cases": 10} for source in CODE},
            "composite": {
                "hiyouga/geometry3k": {
                    "components": [
                        {"kind": "math", "weight": 0.9},
                        {"kind": "format", "weight": 0.1,
                         "pattern": r"^<think>.*</think>.*\\boxed\{.*\}.*$"},
                    ]
                }
            },
        }
    }  # fmt: skip
    with configured_reward_server(logs, config) as server:
        yield server


def test_verl_like_config_scores_as_verl_does(verl_like: RewardServer) -> None:
    res = verl_like.one(
        {"kind": "code", "data_source": "codecontests", "response": TEN_RIGHT, "tests": HALF}
    )
    assert res["score"] == 1.0 and "the first 10 of 12" in res["detail"], res
    got = [
        math(verl_like, "hiyouga/geometry3k", response, "30")["score"]
        for response in (
            r"<think>angles</think> The angle is \boxed{30}.",
            r"The angle is \boxed{30}.",
            r"<think>angles</think> The angle is \boxed{60}.",
        )
    ]
    assert got == [pytest.approx(1.0), pytest.approx(0.9), pytest.approx(0.1)]
