"""Routes by data source (``reward.routes``): scorer options for items that do not set them.

A route names a kind and that kind's options (math ``extraction``, code ``scoring`` and
``first_cases``). It fills an option in only when the item left it out, and only for items of the route's kind, so a client that
says what it wants always gets it. Routes apply before composite specs, whose math and code
components then score with the filled-in options.

A math item of a named data source that no route covers and that names no extraction is scored by
the default (``last_boxed``), which may read none of its answers: :meth:`Routes.first_unrouted`
names each such data source once, for the service to report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynamo_rl.config.reward import Route, RouteTable


class Routes(RouteTable):
    """Finds a data source's route (:class:`RouteTable`: an exact key first, then the longest
    matching pattern) and fills its options into items."""

    def __init__(self, routes: Mapping[str, Route | None]) -> None:
        super().__init__(routes)
        self.reported: set[str] = set()  # unrouted data sources already named

    def first_unrouted(self, item: Any) -> str | None:
        """``item``'s data source when ``item``, after :meth:`apply`, is a math item of a named data
        source that still names no extraction (no math route with one covers it), the first time
        that data source is seen; else None."""
        source = item.data_source
        if item.kind != "math" or item.extraction is not None or not source:
            return None
        if source in self.reported:
            return None
        self.reported.add(source)
        return source

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
        if item.kind == "code":
            update = {
                key: getattr(route, key)
                for key in ("scoring", "first_cases")
                if key not in item.model_fields_set and getattr(route, key) is not None
            }
            return item.model_copy(update=update) if update else item
        return item
