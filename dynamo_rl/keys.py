"""Every Redis key the services share, named in one place.

All keys start with ``dynamo:``; most are scoped by a namespace (the experiment / dataset name,
``run.name`` by default) so several experiments can share one Redis.
"""

from __future__ import annotations

PREFIX = "dynamo"


def _check(namespace: str) -> str:
    if not namespace or any(c in namespace for c in " \t\r\n{}"):
        raise ValueError(f"namespace must be non-empty without spaces or braces, got {namespace!r}")
    return namespace


def stats_key(namespace: str) -> str:
    """Hash of per-prompt success statistics (allocator)."""
    return f"{PREFIX}:stats:{_check(namespace)}"


def grad_stats_key(namespace: str) -> str:
    """Hash of per-prompt gradient statistics (learner writes, allocator reads;
    ``dynamo_rl.contracts.gradstats``)."""
    return f"{PREFIX}:gradstats:{_check(namespace)}"


def trajectory_stream(namespace: str) -> str:
    """Stream of encoded trajectory groups (rollout workers XADD, learner XREADGROUP)."""
    return f"{PREFIX}:traj:{_check(namespace)}"


def dead_letter_stream(namespace: str) -> str:
    """Stream of entries the learner could not decode and prompts the engines refused, each with
    its reason."""
    return f"{PREFIX}:traj-dead:{_check(namespace)}"


def learner_group(namespace: str) -> str:
    """Consumer group name of the learner on the trajectory stream."""
    return f"learner:{_check(namespace)}"


def weight_version_key(namespace: str) -> str:
    """Integer weight version the learner bumps after every push."""
    return f"{PREFIX}:weights:version:{_check(namespace)}"


def engines_key(namespace: str) -> str:
    """Hash of registered inference engines (url -> JSON with address and version)."""
    return f"{PREFIX}:engines:{_check(namespace)}"


def engine_pulse_key(namespace: str, url: str) -> str:
    """An engine's pulse: a counter the engine raises every second while its serving process
    runs, expiring unless raised (``dynamo_rl.contracts.engine.EnginePulse``)."""
    return f"{PREFIX}:pulse:{_check(namespace)}:{url.rstrip('/')}"


def lease_key(namespace: str, worker_id: str) -> str:
    """A rollout worker's lease on the prompts it holds (expires if the worker dies)."""
    return f"{PREFIX}:lease:{_check(namespace)}:{worker_id}"


def pushed_batch_key(namespace: str, batch_id: str) -> str:
    """Marker of a rollout batch already in the stream (its entry ids), so a retried push after a
    lost reply does not add the batch twice; expires after a day."""
    if not batch_id or any(c.isspace() for c in batch_id):
        raise ValueError(f"batch_id must be non-empty without whitespace, got {batch_id!r}")
    return f"{PREFIX}:pushed:{_check(namespace)}:{batch_id}"
