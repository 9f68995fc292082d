"""The registry of passes by name.

`@rewrite(name)` registers a pass users can name (`REWRITES`, `--disable-rewrite NAME`);
`@step(name)` registers a pipeline step that is not one (`STEPS`: shape inference, dead-code
removal, and the sign-function classifier, which users disable through its four labels,
`SIGN_IDIOMS`). Both are `(graph: OnnxGraph) -> int`, how many rewrites were made; the
order they run in is `converters.normalize.fixpoint.PIPELINE`.
"""

from __future__ import annotations

from collections.abc import Callable

from bnnexport.converters.graph import OnnxGraph

Pass = Callable[[OnnxGraph], int]
REWRITES: dict[str, Pass] = {}
STEPS: dict[str, Pass] = {}
# the labels of the rewrites the sign-function classifier (one step) makes
SIGN_IDIOMS = ("bitorch-sign", "cast-compare", "where-compare", "plain-sign")


def _register(table: dict[str, Pass], name: str) -> Callable[[Pass], Pass]:
    def register(function: Pass) -> Pass:
        if name in REWRITES or name in STEPS:
            raise ValueError(f"rewrite {name!r} is registered twice")
        table[name] = function
        return function

    return register


def rewrite(name: str) -> Callable[[Pass], Pass]:
    """Register a pass under `name` (refusing duplicates); it returns how many rewrites it made."""
    return _register(REWRITES, name)


def step(name: str) -> Callable[[Pass], Pass]:
    """Register a pipeline step users cannot disable by name (refusing duplicates)."""
    return _register(STEPS, name)


def registered(name: str) -> Pass:
    """The pass or step called `name`, looked up when it runs (so a test can replace one)."""
    return REWRITES[name] if name in REWRITES else STEPS[name]


def count_rewrites(graph: OnnxGraph, name: str, n: int = 1) -> None:
    """Add `n` rewrites under `name` to the graph's report."""
    if n:
        graph.report.applied[name] = graph.report.applied.get(name, 0) + n
