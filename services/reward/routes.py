"""Routes by data source (``reward.routes``): scorer options for items that do not set them.

A route names a kind and that kind's options (math ``extraction``, code ``scoring`` and
``first_cases``). It fills an option in only when the item left it out, and only for items of the route's kind, so a client that
says what it wants always gets it. Routes apply before composite specs, whose math and code
components then score with the filled-in options.
"""

from __future__ import annotations

from typing import Any

from dynamo_rl.config.reward import RouteTable


class Routes(RouteTable):
    """Finds a data source's route (:class:`RouteTable`: an exact key first, then the longest
    matching pattern) and fills its options into items."""

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
