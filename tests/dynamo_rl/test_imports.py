"""The shared package and the command line stay light: no torch before a subcommand needs it."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.conftest import dynamo_rl_argv


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


def test_importing_dynamo_rl_does_not_import_torch() -> None:
    # The shared package, and the launcher, dashboard and task generators built on it.
    code = (
        "import sys, dynamo_rl, dynamo_rl.config, dynamo_rl.codec, dynamo_rl.keys, "
        "dynamo_rl.metrics, dynamo_rl.procs, dynamo_rl.cli, dynamo_rl.retry, dynamo_rl.redis_client, "
        "dynamo_rl.sample_log, dynamo_rl.trackers, dynamo_rl.envs, dynamo_rl.service_table, "
        "dynamo_rl.clients.base, dynamo_rl.clients.allocator, dynamo_rl.envs.sandbox, "
        "launcher.supervisor, launcher.up, launcher.stage, "
        "launcher.warm_start, dashboard.cli, dashboard.server, dashboard.sources, "
        "dashboard.advantages, tasks.arith, tasks.products, tasks.cli, tasks.convert\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr


def test_help_is_fast_and_light() -> None:
    start = time.perf_counter()
    result = subprocess.run(dynamo_rl_argv("--help"), capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    for name in ("allocator", "reward", "engine", "rollout", "learner", "up", "eval"):
        assert name in result.stdout
    # Generous bound for a loaded CI machine; the real figure is ~0.1 s.
    assert elapsed < 3.0, elapsed
    code = (
        "import sys\n"
        "from dynamo_rl.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    assert _run(code).returncode == 0


def test_every_subcommand_names_a_module_that_exists() -> None:
    # The table names modules as strings (imported only when the subcommand runs): a module moved
    # without its entry would fail only when someone runs that subcommand.
    import importlib.util

    from dynamo_rl.cli import SUBCOMMANDS

    missing = [m for m, _help in SUBCOMMANDS.values() if importlib.util.find_spec(m) is None]
    assert not missing, missing
