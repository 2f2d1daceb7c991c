"""The shared command-line support of the services (``dynamo_rl.cli``): bind flags whose help
states the config's defaults, and the refusal to expose control routes without a token."""

from __future__ import annotations

import argparse

import pytest

from allocator.cli import build_parser as allocator_parser
from dynamo_rl.cli import EXIT_CONFIG, parse_config, refuse_open_bind
from dynamo_rl.config import ExperimentConfig
from services.engine.cli import _parser as engine_parser
from services.reward.cli import build_parser as reward_parser


def _help_of(parser: argparse.ArgumentParser, flag: str) -> str:
    return next(a.help for a in parser._actions if flag in a.option_strings) or ""


@pytest.mark.parametrize(
    ("section", "parser"),
    [("allocator", allocator_parser), ("engine", engine_parser), ("reward", reward_parser)],
)
def test_bind_flags_name_their_key_and_the_configs_default(section, parser) -> None:
    defaults = getattr(ExperimentConfig(), section)
    p = parser()
    assert _help_of(p, "--host") == f"address to bind ({section}.host, default {defaults.host})"
    assert _help_of(p, "--port").endswith(f"({section}.port, default {defaults.port})")
    _args, cfg = parse_config(p, ["--host", "::1", "--port", "0"])
    assert (getattr(cfg, section).host, getattr(cfg, section).port) == ("::1", 0)


def test_an_open_bind_without_a_token_exits_2_with_the_reason(capsys) -> None:
    refuse_open_bind("engine", "engine.host", "127.0.0.1", None)
    refuse_open_bind("engine", "engine.host", "0.0.0.0", "secret")
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as exited:
        refuse_open_bind("allocator", "allocator.host", "0.0.0.0", None)
    assert exited.value.code == EXIT_CONFIG == 2
    err = capsys.readouterr().err
    assert err.startswith("dynamo-rl allocator: allocator.host: refusing to bind '0.0.0.0'")
    assert "DYNAMO_CONTROL_TOKEN" in err
    with pytest.raises(SystemExit):
        refuse_open_bind("engine", "engine.host", "::", "")


def test_the_allocator_refuses_an_open_bind_before_serving(capsys) -> None:
    from allocator.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--host", "0.0.0.0", "--port", "0"])
    assert exited.value.code == EXIT_CONFIG
    assert "refusing to bind '0.0.0.0'" in capsys.readouterr().err
