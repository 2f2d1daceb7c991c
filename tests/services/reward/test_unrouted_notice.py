"""Math items of a named data source with no route and no extraction of their own are scored by
the default extraction, which may read none of their answers: the reward service tells the user,
once per data source, in the run folder's notices (``unrouted_data``)."""

from __future__ import annotations

from pathlib import Path

from dynamo_rl.notices import read_notices
from tests.services.reward.conftest import start_reward_server


def test_an_unrouted_math_source_is_one_warning(tmp_path: Path) -> None:
    run = tmp_path / "run"
    server = start_reward_server(tmp_path, [f"run.dir={run}"])
    try:
        item = {"kind": "math", "response": "#### 4", "ground_truth": "4"}
        for _ in range(2):
            server.verify(
                {"id": "a", **item, "data_source": "mystery"},
                {"id": "b", **item, "data_source": "mystery", "extraction": "gsm8k"},
                {"id": "c", **item, "data_source": "openai/gsm8k"},
                {"id": "d", **item},  # no data source: the client chose the default itself
            )
        server.verify({"id": "e", **item, "data_source": "other/set"})
    finally:
        server.proc.stop()
    notices = read_notices(run)
    assert [(n.service, n.kind, n.about) for n in notices] == [
        ("reward", "unrouted_data", "mystery"), ("reward", "unrouted_data", "other/set"),
    ]  # fmt: skip
    assert notices[0].message == (
        "math items of data_source 'mystery' have no reward route (reward.routes) and name no "
        "extraction: scored by the default, last_boxed, which may read none of their answers"
    )
    log = (tmp_path / "reward.log").read_text()
    assert log.count("data_source 'mystery' have no reward route") == 1  # not once per item
