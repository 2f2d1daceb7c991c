"""The services' metric registries, as the dashboards' checks see them.

Each service keeps all its metrics in one class in its ``metrics.py`` whose no-argument constructor
holds a :class:`dynamo_rl.metrics.ServiceMetrics` in ``metrics``. :func:`service_registry` builds
that class and returns every sample name it can expose. A labelled metric exposes no sample until a
label set is first used, so the names are derived from each metric family's type as well as read
from the samples present (``ServiceMetrics.names``). A module or class the table names that is
not there is an error, not a skip: the checks built on it must never pass by checking nothing.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from dynamo_rl.metrics import ServiceMetrics

# service prefix (dynamo_<service>_...) -> (module, class names; None: every class in the module
# whose no-argument instance has a ServiceMetrics in ``metrics``)
METRIC_CLASSES: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "allocator": ("allocator.metrics", None),
    "reward": ("services.reward.metrics", None),
    "engine": ("services.engine.metrics", ("EngineMetrics",)),
    "rollout": ("services.rollout.metrics", ("WorkerMetrics",)),
    "learner": ("learner.metrics", ("LearnerMetrics",)),
}


def exposed_names(metrics: ServiceMetrics) -> set[str]:
    """Every sample name the registry exposes now or once its labelled metrics are used."""
    return metrics.names()


@dataclass
class Registry:
    service: str
    instances: list[object]
    names: set[str]


def _classes(module: object, wanted: tuple[str, ...] | None) -> list[type]:
    if wanted is not None:
        return [getattr(module, name) for name in wanted if hasattr(module, name)]
    return [
        cls
        for _name, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__  # type: ignore[attr-defined]
    ]


def service_registry(service: str) -> Registry:
    module_name, wanted = METRIC_CLASSES[service]
    module = importlib.import_module(module_name)
    if wanted is not None:
        absent = [name for name in wanted if not hasattr(module, name)]
        if absent:
            raise LookupError(f"{module_name} has no {', '.join(absent)}")
    instances: list[object] = []
    for cls in _classes(module, wanted):
        try:
            instance = cls()
        except TypeError:  # not a metrics class (needs arguments)
            continue
        if isinstance(getattr(instance, "metrics", None), ServiceMetrics):
            instances.append(instance)
    if not instances:
        what = ", ".join(wanted) if wanted else "a class with a ServiceMetrics in .metrics"
        raise LookupError(f"{module_name} has no {what}")
    names: set[str] = set()
    for instance in instances:
        names |= exposed_names(instance.metrics)  # type: ignore[attr-defined]
    return Registry(service, instances, names)


def service_of(metric: str) -> str:
    """``dynamo_<service>_...`` -> ``<service>``."""
    parts = metric.split("_")
    if len(parts) < 3 or parts[0] != "dynamo" or parts[1] not in METRIC_CLASSES:
        raise ValueError(f"{metric!r} does not follow dynamo_<service>_<name> with a known service")
    return parts[1]
