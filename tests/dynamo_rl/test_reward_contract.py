"""Both ends of the reward contract (``dynamo_rl.contracts.reward``) against each other.

One real reward service process (``dynamo-rl reward``, with a composite spec for one data
source) and, against it, the rollout side's real :class:`RewardClient` with items built the way
the worker builds them (:func:`services.rollout.datasets.reward_item`), and SandboxFusion's own
Python client on ``/run_code``; and the client against replies the service never gives, from a
small canned HTTP server.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import sandbox_fusion
import yaml
from pydantic import ValidationError

from dynamo_rl.contracts.reward import (
    KINDS,
    CodeItem,
    Health,
    ItemResult,
    MathItem,
    RunCodeRequest,
    VerifyItem,
)
from services.reward.registry import SCORERS
from services.rollout.datasets import record_from_row, reward_item
from services.rollout.reward_client import RewardClient, RewardRequestError
from tests.services.reward.conftest import RewardServer, start_reward_server

SPEC = {
    "reward": {
        "composite": {
            "mixed": {
                "components": [
                    {"kind": "math", "weight": 1.0},
                    {"kind": "format", "name": "think", "pattern": "<think>", "weight": 0.5},
                ]
            }
        }
    }
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    logs = tmp_path_factory.mktemp("reward-contract")
    path = logs / "reward.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    server = start_reward_server(logs, ["--config", str(path)])
    try:
        yield server
    finally:
        server.proc.stop()


def verify(url: str, items: list[VerifyItem], **kw: Any) -> list[ItemResult]:
    async def go() -> list[ItemResult]:
        client = RewardClient(url, **kw)
        try:
            return await client.verify(items)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_the_server_scores_every_kind_of_the_contract() -> None:
    """A kind in the contract with no scorer (or the reverse) would be refused or unreachable."""
    assert set(SCORERS) == set(KINDS)


def test_client_items_from_dataset_rows_are_scored_by_the_server(server: RewardServer) -> None:
    """Rows as the worker reads them -> reward_item -> RewardClient -> server -> typed results."""
    stdio = {"type": "stdio", "cases": [{"stdin": "3\n", "stdout": "4"}, {"stdin": "9", "stdout": "10"}]}  # fmt: skip
    rows = [
        {"prompt": [{"role": "user", "content": "2+2?"}], "data_source": "gsm",
         "reward_model": {"ground_truth": "4"}, "ability": "math"},
        {"prompt": "Add one.", "kind": "code", "tests": stdio, "data_source": "apps"},
        {"prompt": "2+2?", "answer": "4", "data_source": "mixed"},
    ]  # fmt: skip
    math, code, mixed = (record_from_row(r, i) for i, r in enumerate(rows))
    items = [
        reward_item(math, "m-ok", "so \\boxed{4}", response_length=5),
        reward_item(math, "m-wrong", "so \\boxed{5}"),
        reward_item(math, "m-none", "I do not know"),
        reward_item(code, "c-ok", "```python\nprint(int(input()) + 1)\n```"),
        reward_item(code, "c-half", "```python\nn = int(input())\nprint(4 if n == 3 else 0)\n```"),
        reward_item(mixed, "x-both", "<think>hm</think> \\boxed{4}"),
        reward_item(mixed, "x-math", "\\boxed{4}"),
    ]
    assert isinstance(items[0], MathItem) and isinstance(items[3], CodeItem)
    results = verify(server.url, items, batch_items=3)  # three requests
    by_id = {r.id: r for r in results}
    assert [r.id for r in results] == [it.id for it in items]
    assert all(isinstance(r, ItemResult) for r in results)
    assert (by_id["m-ok"].correct, by_id["m-ok"].score, by_id["m-ok"].reason) == (True, 1.0, "ok")
    assert (by_id["m-wrong"].correct, by_id["m-wrong"].reason) == (False, "wrong_answer")
    assert (by_id["m-none"].format_ok, by_id["m-none"].reason) == (False, "no_answer")
    assert by_id["c-ok"].correct and by_id["c-ok"].score == 1.0
    assert by_id["c-half"].score == 0.5 and by_id["c-half"].reason == "wrong_answer"
    # The composite route answers with components; plain kinds without.
    assert by_id["x-both"].components == {"math": 1.0, "think": 1.0}
    assert by_id["x-both"].score == 1.5
    assert by_id["x-math"].components == {"math": 1.0, "think": 0.0}
    assert by_id["m-ok"].components is None


def test_integer_ids_come_back_as_sent(server: RewardServer) -> None:
    items = [MathItem(id=7, kind="math", response="\\boxed{1}", ground_truth="1")]
    (result,) = verify(server.url, items)
    assert result.id == 7 and result.correct


def test_health_parses_into_the_contract(server: RewardServer) -> None:
    async def go() -> Health:
        client = RewardClient(server.url)
        try:
            return await client.health()
        finally:
            await client.aclose()

    health = asyncio.run(go())
    assert health.status == "ok" and {"math", "code"} <= set(health.kinds)
    assert health.composite == ["mixed"] and health.sandbox == "bwrap"


def test_config_dependent_refusals_reach_the_client_as_request_errors(
    server: RewardServer,
) -> None:
    """The contract admits 'model' items; this server has no reward model and refuses them."""
    item = reward_item(record_from_row({"prompt": "q", "kind": "model"}, 0), "r", "x")
    with pytest.raises(RewardRequestError, match="422") as info:
        verify(server.url, [item])
    assert "items.0.kind" in str(info.value) and "disabled" in str(info.value)


def test_items_the_contract_refuses_are_refused_before_sending() -> None:
    with pytest.raises(ValidationError, match="only supported with language 'python'"):
        CodeItem(id="a", kind="code", response="", language="c",
                 tests={"type": "assert", "code": "assert 1"})  # fmt: skip
    with pytest.raises(ValidationError):
        MathItem(id="a", kind="math", response="x", ground_truth="")


# --- /run_code with SandboxFusion's own client ------------------------------------------------


def sf_run(server: RewardServer, **fields: Any) -> Any:
    request = sandbox_fusion.RunCodeRequest(**fields)
    # One attempt: the client retries non-200 answers with back-off, which would hide a 422.
    return sandbox_fusion.run_code(request, endpoint=server.url, max_attempts=1, client_timeout=60)


def test_sandbox_fusion_default_request_is_accepted(server: RewardServer) -> None:
    """The client's default request carries ``stdin: null`` and its 10 s timeouts."""
    request = sandbox_fusion.RunCodeRequest(code="print(6 * 7)", language="python")
    sent = request.dict()
    assert sent["stdin"] is None and sent["files"] == {} and sent["run_timeout"] == 10
    RunCodeRequest.model_validate(sent)  # our model takes it as is
    response = sandbox_fusion.run_code(request, endpoint=server.url, max_attempts=1)
    assert response.status == sandbox_fusion.RunStatus.Success
    assert response.run_result is not None
    assert response.run_result.status == sandbox_fusion.CommandRunStatus.Finished
    assert response.run_result.stdout == "42\n" and response.run_result.return_code == 0
    mapping = sandbox_fusion.SummaryMapping(RunFailed="rf", RunTimeout="rt", CompileFailed="cf")
    assert sandbox_fusion.summary_run_code_result(response, mapping) == "Success"


def test_sandbox_fusion_stdin_failures_and_timeouts(server: RewardServer) -> None:
    mapping = sandbox_fusion.SummaryMapping(RunFailed="rf", RunTimeout="rt", CompileFailed="cf")
    out = sf_run(server, code="import sys\nprint(sys.stdin.read().upper())", language="python",
                 stdin="abc")  # fmt: skip
    assert out.status == sandbox_fusion.RunStatus.Success and out.run_result.stdout == "ABC\n"
    out = sf_run(server, code="import sys; sys.exit(3)", language="python")
    assert out.status == sandbox_fusion.RunStatus.Failed and out.run_result.return_code == 3
    assert sandbox_fusion.summary_run_code_result(out, mapping) == "rf"
    out = sf_run(server, code="while True: pass", language="python", run_timeout=1)
    assert out.run_result.status == sandbox_fusion.CommandRunStatus.TimeLimitExceeded
    assert sandbox_fusion.summary_run_code_result(out, mapping) == "rt"


def test_sandbox_fusion_cpp_compile_and_compile_error(server: RewardServer) -> None:
    mapping = sandbox_fusion.SummaryMapping(RunFailed="rf", RunTimeout="rt", CompileFailed="cf")
    out = sf_run(server, code='#include <cstdio>\nint main(){puts("hi");}', language="cpp")
    assert out.status == sandbox_fusion.RunStatus.Success and out.run_result.stdout == "hi\n"
    assert out.compile_result.status == sandbox_fusion.CommandRunStatus.Finished
    out = sf_run(server, code="int main( {", language="cpp")
    assert out.status == sandbox_fusion.RunStatus.Failed and out.run_result is None
    assert sandbox_fusion.summary_run_code_result(out, mapping) == "cf"


def test_sandbox_fusion_languages_beyond_the_subset_are_refused(server: RewardServer) -> None:
    with pytest.raises(Exception, match="422") as info:
        sf_run(server, code="fn main(){}", language="rust")
    assert "language" in str(info.value)


# --- the client against replies the real service never gives ----------------------------------


@pytest.fixture
def canned() -> Iterator[tuple[str, list[Any], list[dict[str, Any]]]]:
    """An HTTP server answering /v1/verify with the next canned body; records request bodies."""
    replies: list[Any] = []
    requests: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            requests.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            data = json.dumps(replies.pop(0)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", replies, requests
    finally:
        server.shutdown()
        server.server_close()


def test_client_sends_only_what_the_item_sets_and_refuses_replies_off_contract(
    canned: tuple[str, list[Any], list[dict[str, Any]]],
) -> None:
    url, replies, requests = canned
    item = MathItem(id="a", kind="math", response="\\boxed{1}", ground_truth="1")
    ok = {"id": "a", "score": 1.0, "correct": True, "format_ok": True, "reason": "ok"}
    replies.append({"results": [ok]})
    (result,) = verify(url, [item])
    assert result == ItemResult(**ok)
    # Unset fields stay unset, so the server's defaults and data-source routes apply.
    assert requests[-1] == {
        "items": [{"id": "a", "kind": "math", "response": "\\boxed{1}", "ground_truth": "1"}]
    }
    replies.append({"results": [{**ok, "reason": "vibes"}]})
    with pytest.raises(RewardRequestError, match="does not fit the contract"):
        verify(url, [item])
    replies.append({"results": [{"id": "a", "score": 1.0}]})
    with pytest.raises(RewardRequestError, match="does not fit the contract"):
        verify(url, [item])
    replies.append({"results": [{**ok, "id": "b"}]})
    with pytest.raises(RewardRequestError, match="lacks 1 of 1 items"):
        verify(url, [item])
