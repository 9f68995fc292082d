"""The registry of passes by name: `@rewrite(name)` adds one, `REWRITES` lists them."""

from __future__ import annotations

from collections.abc import Callable

from converters.normalize.editable_graph import EditableGraph

Pass = Callable[[EditableGraph], int]
REWRITES: dict[str, Pass] = {}
# passes whose rewrites are labelled inside one routine (the sign-function classifier)
SIGN_IDIOMS = ("bitorch-sign", "cast-compare", "where-compare", "plain-sign")


def rewrite(name: str) -> Callable[[Pass], Pass]:
    """Register a pass under `name` (refusing duplicates); it returns how many rewrites it made."""

    def register(function: Pass) -> Pass:
        if name in REWRITES:
            raise ValueError(f"rewrite {name!r} is registered twice")
        REWRITES[name] = function
        return function

    return register


def count_rewrites(graph: EditableGraph, name: str, n: int = 1) -> None:
    if n:
        graph.report.applied[name] = graph.report.applied.get(name, 0) + n
