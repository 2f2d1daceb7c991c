"""The one way a service marks a warning for the user (:mod:`dynamo_rl.notices`), and the JSON-lines
tail the launcher reads run-folder files with (:class:`dynamo_rl.jsonl.Tail`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from dynamo_rl.jsonl import Tail
from dynamo_rl.notices import FILE, KINDS, SERVICE_ENV, Notices, read_notices

log = logging.getLogger("tests.notices")


def test_a_warning_is_logged_every_time_and_written_once_per_kind_and_subject(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SERVICE_ENV, raising=False)
    notices = Notices(tmp_path, "rollout")
    with caplog.at_level(logging.WARNING, logger="tests.notices"):
        notices.warn(log, "prompt_refused", "prompt p1 refused")
        notices.warn(log, "prompt_refused", "prompt p2 refused")
        notices.warn(log, "prompts_over_length", "3 of 9 prompts exceed 8 tokens", about="a.jsonl")
        notices.warn(log, "prompts_over_length", "4 of 9 prompts exceed 8 tokens", about="b.jsonl")
    assert [r.getMessage() for r in caplog.records] == [
        "prompt p1 refused", "prompt p2 refused", "3 of 9 prompts exceed 8 tokens",
        "4 of 9 prompts exceed 8 tokens",
    ]  # fmt: skip
    lines = [json.loads(x) for x in (tmp_path / FILE).read_text().splitlines()]
    assert [(x["service"], x["kind"], x["about"], x["message"]) for x in lines] == [
        ("rollout", "prompt_refused", "", "prompt p1 refused"),
        ("rollout", "prompts_over_length", "a.jsonl", "3 of 9 prompts exceed 8 tokens"),
        ("rollout", "prompts_over_length", "b.jsonl", "4 of 9 prompts exceed 8 tokens"),
    ]


def test_the_launcher_names_the_service_and_readers_show_each_warning_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SERVICE_ENV, "rollout0")
    Notices(tmp_path, "rollout").warn(log, "no_signal", "first")
    monkeypatch.setenv(SERVICE_ENV, "rollout1")  # a second worker (or a restart) says it again
    Notices(tmp_path, "rollout").warn(log, "no_signal", "again")
    Notices(tmp_path, "rollout").warn(log, "engine_left_out", "engine e", about="http://e")
    (tmp_path / FILE).open("a").write('{"kind": "no_signal", "mess')  # being written
    shown = read_notices(tmp_path)
    assert [(n.service, n.kind, n.message) for n in shown] == [
        ("rollout0", "no_signal", "first"), ("rollout1", "engine_left_out", "engine e"),
    ]  # fmt: skip
    assert read_notices(tmp_path / FILE) == shown
    assert read_notices(tmp_path / "nowhere") == []


def test_unknown_kinds_are_refused_and_no_run_folder_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="notice kind must be one of prompts_over_length, "):
        Notices(tmp_path, "x").warn(log, "oops", "m")
    Notices(None, "x").warn(log, next(iter(KINDS)), "m")
    assert not (tmp_path / FILE).exists()


def test_a_tail_returns_complete_new_lines_once(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    assert Tail(path, "step").read() == []  # not there yet
    path.write_text('{"step": 1}\n{"other": 1}\nnot json\n')
    late = Tail(path, "step", from_end=True)
    tail = Tail(path, "step")
    assert tail.read() == [{"step": 1}]
    assert tail.read() == []
    with open(path, "a") as f:
        f.write('{"step": 2}\n{"step": 3, "half')
    assert tail.read() == [{"step": 2}]
    with open(path, "a") as f:
        f.write('": 1}\n')
    assert tail.read() == [{"step": 3, "half": 1}]
    assert late.read() == [{"step": 2}, {"step": 3, "half": 1}]
