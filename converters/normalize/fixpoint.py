"""`normalize`: `PIPELINE` run to a fixpoint, the result checked (`check_valid`), and the pass
that broke a valid graph named."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import onnx
from bnnexport.converters.errors import InvalidModelError
from bnnexport.converters.graph import NormalizeReport, OnnxGraph

# the pass modules register their passes when imported
from bnnexport.converters.normalize import (  # noqa: F401
    exporter_idioms,
    folding,
    layout,
    sign_idioms,
    slicing,
)
from bnnexport.converters.normalize.registry import REWRITES, SIGN_IDIOMS, registered, step
from bnnexport.converters.runtimes import ort_session

# The order the steps run in, every round, until a round changes nothing: the one statement of
# it (docs and docstrings point here). Every name is a pass users can disable (`REWRITES`) or a
# step they cannot (`STEPS`); each is called as `step(graph) -> rewrites made`.
PIPELINE = (
    "fix-batch",  # static shapes first: shape chains then fold (a no-op after the first round)
    "infer-shapes",
    "drop-noise",
    "fold-constants",
    "qonnx-bipolar",
    "index-put",
    "scatter-concat",  # after fold-constants: the scatter's indices are a folded shape chain
    "split-slices",
    "concat-slices",
    "ste-detach",
    "keras-prelu",
    "drop-dead-code",  # the classifier and the passes after it count only live readers
    "sign-idioms",  # bitorch-sign, cast-compare, where-compare, plain-sign (`SIGN_IDIOMS`)
    "clamp-sign",
    "reshape-transpose",
    "pad-transpose",
    "transpose-binarized",
    "transpose-sink",
)


def normalize(
    model: onnx.ModelProto,
    disabled: Iterable[str] = (),
    max_rounds: int = 64,
) -> tuple[onnx.ModelProto, NormalizeReport]:
    """Run every enabled pass until none changes the graph; (normalised model, report).

    The result is checked valid (`check_valid`) before anything reads it; when it is not, the
    passes are run again, checked one at a time, to name the one that made a valid graph
    invalid (InvalidModelError, one line).

    Args:
        model: any ONNX model (left unchanged).
        disabled: pass names to skip (see `REWRITES`); used to show what each one is for.
    """
    disabled = set(disabled)
    unknown = disabled - set(REWRITES)
    if unknown:
        raise ValueError(f"unknown rewrite(s) {sorted(unknown)}; known: {sorted(REWRITES)}")
    normalized, report = _run(model, disabled, max_rounds)
    if check_valid(normalized, report) is not None:
        _name_the_broken_pass(model, disabled, max_rounds)
    return normalized, report


def normalized_or_as_is(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` as `normalize` writes it, or `model` itself where the normaliser refuses it
    (a probe then reads what it can: a reader that must not fail on a graph convert would
    refuse, such as the export gate's)."""
    from bnnexport.converters.errors import ConverterError

    try:
        return normalize(model)[0]
    except ConverterError:
        return model


def _run(
    model: onnx.ModelProto,
    disabled: set[str],
    max_rounds: int,
    after: Callable[[str, OnnxGraph], None] | None = None,
) -> tuple[onnx.ModelProto, NormalizeReport]:
    """`PIPELINE` in rounds until a round changes nothing; `after(name, graph)` is called after
    each step that changed the graph."""
    enabled = [n for n in SIGN_IDIOMS if n not in disabled]
    graph = OnnxGraph(onnx.ModelProto.FromString(model.SerializeToString()), sign_idioms=enabled)
    steps = [name for name in PIPELINE if name not in disabled]
    for _ in range(max_rounds):
        changed = 0
        for name in steps:
            done = registered(name)(graph)
            if done and after is not None:
                after(_described(name, graph), graph)
            changed += done
        if not changed:
            break
    return graph.build(keep_types=False), graph.report


def _described(name: str, graph: OnnxGraph) -> str:
    """A step as the user names it: the classifier by the idioms it may rewrite."""
    if name == "sign-idioms":
        return f"sign idioms ({', '.join(n for n in SIGN_IDIOMS if n in graph.sign_idioms)})"
    return name


@step("infer-shapes")
def _infer_shapes(graph: OnnxGraph) -> int:
    """Refresh value types and shapes (what the passes after it read); never a rewrite."""
    graph.infer()
    return 0


@step("drop-dead-code")
def _drop_dead_code(graph: OnnxGraph) -> int:
    """Drop nodes no output reads, so that the passes after it count only live readers."""
    graph.dead_code()
    return 0


def check_valid(model: onnx.ModelProto, report: NormalizeReport) -> str | None:
    """None when `model` passes onnx.checker, ONNX Runtime loads it and every source the
    report names is a tensor of it; else the first line of what is wrong."""
    names = {i.name for i in model.graph.input} | {o for n in model.graph.node for o in n.output}
    missing = sorted(set(report.zero_sensitive) - names)
    if missing:
        return f"the zero-free check names tensor(s) the graph lacks: {', '.join(missing)}"
    try:
        if model.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF:
            onnx.checker.check_model(model)
        ort_session(model.SerializeToString())
    except Exception as error:
        return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return None


def _name_the_broken_pass(model, disabled, max_rounds) -> None:
    """Run the passes again, checking after each one; InvalidModelError naming the first pass
    that turned a valid graph into an invalid one. None when no pass did: the input was not
    valid to begin with (a custom op whose pass is disabled), and the stage that meets what
    is left reports it."""
    state = {"valid": check_valid(model, NormalizeReport()) is None}

    def after(name: str, graph: OnnxGraph) -> None:
        found = check_valid(graph.build(keep_types=False), graph.report)
        if found is not None and state["valid"]:
            raise InvalidModelError(
                f"internal error: the normaliser's pass {name} produced an invalid ONNX graph "
                f"({found}); --disable-rewrite skips a pass"
            )
        state["valid"] = found is None

    _run(model, disabled, max_rounds, after)
