"""Routes by data source (``reward.routes``): scorer options for items that do not set them.

A route names a kind and that kind's options (math ``extraction``, code ``scoring``). It fills an
option in only when the item left it out, and only for items of the route's kind, so a client that
says what it wants always gets it. Routes apply before composite specs, whose math and code
components then score with the filled-in options.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from dynamo_rl.config.reward import Route

_GLOB = frozenset("*?[")


class Routes:
    """Finds a data source's route: an exact key first, then the longest matching pattern."""

    def __init__(self, routes: dict[str, Route | None]) -> None:
        self.exact = {k: r for k, r in routes.items() if r is not None and not _GLOB & set(k)}
        self.patterns = sorted(
            ((k, r) for k, r in routes.items() if r is not None and _GLOB & set(k)),
            key=lambda kr: -len(kr[0]),
        )

    def find(self, data_source: str | None) -> tuple[str, Route] | None:
        """``(key, route)`` for ``data_source``, or None."""
        if data_source is None:
            return None
        if data_source in self.exact:
            return data_source, self.exact[data_source]
        for key, route in self.patterns:
            if fnmatch.fnmatchcase(data_source, key):
                return key, route
        return None

    def apply(self, item: Any) -> Any:
        """The item with its route's options filled in where the item has none."""
        found = self.find(item.data_source)
        if found is None:
            return item
        route = found[1]
        if route.kind != item.kind:
            return item
        if item.kind == "math" and item.extraction is None and route.extraction is not None:
            return item.model_copy(update={"extraction": route.extraction})
        if item.kind == "code" and "scoring" not in item.model_fields_set and route.scoring:
            return item.model_copy(update={"scoring": route.scoring})
        return item
