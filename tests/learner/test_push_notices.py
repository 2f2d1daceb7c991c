"""An engine a successful weight push left out is a warning for the user (``engine_left_out`` in
the run folder's notices), once per engine however many pushes leave it out."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamo_rl.notices import SERVICE_ENV, Notices, read_notices
from learner.push import PushResult
from learner.trainer import warn_left_out


def test_each_engine_left_out_is_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SERVICE_ENV, raising=False)
    notices = Notices(tmp_path, "learner")
    warn_left_out(notices, PushResult(True, 2, 0, 0.1), 1)  # nobody left out: no warning
    assert read_notices(tmp_path) == []
    for version in (2, 3):
        result = PushResult(True, 3, 0, 0.1, "http://a: unreachable", failed=("http://a",))
        warn_left_out(notices, result, version)
    warn_left_out(notices, PushResult(True, 3, 0, 0.1, "b down", failed=("http://b",)), 4)
    assert [(n.service, n.kind, n.about, n.message) for n in read_notices(tmp_path)] == [
        ("learner", "engine_left_out", "http://a",
         "engine http://a left out of the weight push of version 2: http://a: unreachable"),
        ("learner", "engine_left_out", "http://b",
         "engine http://b left out of the weight push of version 4: b down"),
    ]  # fmt: skip
