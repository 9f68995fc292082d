"""Sign ties: tell a float-rounding tie at a binarization from a real mismatch.

Two runtimes sum the same real values in different orders, so they differ by rounding (about
1e-7 of a tensor's largest value). Where a binarization's input lies that close to zero, one
runtime may say +1 and the other -1; every later binary layer then sees a different bit, and the
logits can differ by a lot. Deep models with real-valued paths (Bi-Real-Net's shortcuts, a float
first layer) meet such ties at native input sizes: an initialised Bi-Real-Net-18 at 224x224 on
2 of 50 samples between PyTorch and ONNX Runtime, on 18 of 50 between ONNX Runtime and LCE
(which folds BatchNorm into its output transform). Neither answer is wrong, but a plain
comparison cannot tell them from a converter bug.

`explain_by_ties` decides it for each sample that fails the comparison. It runs the ONNX model
in ONNX Runtime rewired (`TieProbe`) so that the sign at any near-tie of a binarization's input
(a value within `TIE_RTOL` of that tensor's largest |value|) can be chosen, and accepts the sample
only if one choice of tie signs reproduces ONNX Runtime's own outputs and another reproduces the
other runtime's, each within the gate's usual tolerance: both are then the same model, up to
which way its ties fell. (The rewired model needs the first check: its extra outputs change ONNX
Runtime's fusions, hence its rounding, so it can land on the other side of a tie from the plain
session too, and a fault in the plain session must not pass for a tie.) A bug shows up as a
sample no choice of tie signs explains. Only the signs are chosen: real-valued values (the
shortcut a Bi-Real block adds) stay as computed.

The other runtime's signs are found one of two ways:
- replayed (`replay_signs`) when it has a witness: a copy that also outputs every
  binarization's input (`converters.lce.LceWitness` for LCE). All its signs are imposed at once,
  and every one that differs from what ONNX Runtime computes from the same upstream signs must
  sit at a near-tie. One run per sample, however many ties: QuickNet at 224x224 meets two to six
  per sample between ONNX Runtime and LCE, spread over its 16 binarizations.
- searched for (`search_ties`, greedy) otherwise: PyTorch, the float TFLite model, and ONNX
  Runtime's own outputs. One to three ties per failing sample is what we meet there, and a
  sample that needs more than `MAX_STEPS` is reported as a mismatch.

Example:
    >>> from converters.ties import explain_by_ties
    >>> resolved, report = explain_by_ties("model.onnx", x, onnx_out, lce_out, rtol=1e-4)
    >>> report.explained, report.positions                  # doctest: +SKIP
    (1, 1)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from converters.graph import Graph, load_onnx
from converters.patterns import find_binary_layers_in, trace_binarized
from converters.validate import (
    SCALING_FUSIONS,
    Agreement,
    check_input_shape,
    compare,
    validate_outputs,
)

TIE_RTOL = 1e-5  # a near-tie: |x| <= TIE_RTOL x max |x| of that binarization's input tensor
FLOAT = onnx.TensorProto.FLOAT
MAX_CANDIDATES = 16  # near-ties tried per step of the search, the closest first
MAX_STEPS = 6  # greedy steps per search


@dataclass
class TieReport:
    """What the tie search found on the samples that failed the plain comparison."""

    failing: int = 0  # samples that failed the plain comparison
    explained: int = 0  # of those, samples some choice of tie signs explains
    positions: int = 0  # activations whose sign was chosen against ONNX Runtime's own
    largest_tie: float = 0.0  # largest |x| / max |x| among those activations
    runs: int = 0  # ONNX Runtime runs the search took
    rows: list[int] = field(default_factory=list)  # the explained samples


def validate_with_ties(
    onnx_path: str | Path,
    inputs: np.ndarray,
    onnx_outputs: np.ndarray,
    other_outputs: np.ndarray,
    rtol: float = 1e-4,
    what: str = "converted model",
    witness: Callable[[], Witness] | None = None,
) -> tuple[Agreement, TieReport]:
    """`validate_outputs(ONNX Runtime, other)` after `explain_by_ties`: raises
    `ConversionMismatchError` for any sample that a choice of tie signs does not explain."""
    resolved, ties = explain_by_ties(
        onnx_path, inputs, onnx_outputs, other_outputs, rtol, witness=witness
    )
    return validate_outputs(resolved, other_outputs, rtol, what), ties


class TieProbe:
    """The ONNX model, rewired so each binarization's input can have chosen signs.

    For every distinct binarization input `x` the probe adds graph inputs `mask` and `value`
    and feeds the binarization `Where(mask, value, x)` instead of `x`; `x` itself is also a
    graph output. Binarizations are ordered as the graph computes them, so a sign chosen at
    binarization k changes only the inputs of binarizations after k.
    """

    def __init__(self, onnx_path: str | Path):
        import onnxruntime as ort

        model = load_onnx(onnx_path)
        for k, node in enumerate(model.graph.node):  # the rewiring finds nodes by name
            node.name = node.name or f"__node_{k}"
        graph = Graph(model)
        position = {node.name: k for k, node in enumerate(model.graph.node)}
        consumers: dict[str, list[str]] = {}
        for layer in find_binary_layers_in(graph):
            found = trace_binarized(graph, layer.input_name)
            if found is not None and found.nodes[0] not in consumers.get(found.source, []):
                consumers.setdefault(found.source, []).append(found.nodes[0])
        self.sources = sorted(consumers, key=lambda s: min(position[n] for n in consumers[s]))
        by_name = {node.name: node for node in model.graph.node}
        extra_nodes = []
        for k, source in enumerate(self.sources):
            chosen = f"{source}__tie_chosen"
            for name in consumers[source]:
                node = by_name[name]
                for i, value in enumerate(node.input):
                    if value == source:
                        node.input[i] = chosen
            mask, value = f"tie_mask_{k}", f"tie_value_{k}"
            extra_nodes.append(onnx.helper.make_node("Where", [mask, value, source], [chosen]))
            make_info = onnx.helper.make_tensor_value_info
            model.graph.input.extend(
                [make_info(mask, onnx.TensorProto.BOOL, None), make_info(value, FLOAT, None)]
            )
            model.graph.output.append(make_info(source, FLOAT, None))
        # the Where nodes go first among the consumers: put them right before the first of them
        nodes = list(model.graph.node)
        for k, source in enumerate(self.sources):
            at = min(nodes.index(by_name[n]) for n in consumers[source])
            nodes.insert(at, extra_nodes[k])
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        self.session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"],
            disabled_optimizers=SCALING_FUSIONS,
        )  # fmt: skip
        self.input = self.session.get_inputs()[0]
        self.shapes: list[tuple[int, ...]] = []  # of the binarization inputs, after a run

    def run(
        self,
        x: np.ndarray,
        chosen: dict[int, tuple[np.ndarray, np.ndarray]],
        imposed: dict[int, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """(logits, binarization inputs) for one sample `x` (C, H, W); `chosen` maps a
        binarization to (flat indices, signs ±1) of the activations whose sign is imposed;
        `imposed` maps a binarization to the signs of all its activations (an array of its
        input's shape without the batch axis)."""
        batch = self.input.shape[0] if isinstance(self.input.shape[0], int) else 1
        feed = {self.input.name: np.repeat(x[None].astype(np.float32), batch, axis=0)}
        for k in range(len(self.sources)):
            # nothing imposed: a one-element mask, which Where broadcasts
            mask, value = np.zeros(1, dtype=bool), np.zeros(1, dtype=np.float32)
            if imposed is not None and k in imposed:  # broadcast over the batch axis
                value = np.asarray(imposed[k], np.float32)[None]
                mask = np.ones(value.shape, dtype=bool)
            elif k in chosen:  # chosen from an earlier run's outputs, so `shapes` is known
                indices, signs = chosen[k]
                mask = np.zeros(self.shapes[k], dtype=bool)
                value = np.zeros(self.shapes[k], dtype=np.float32)
                mask[0].flat[indices] = True
                value[0].flat[indices] = signs
            feed[f"tie_mask_{k}"], feed[f"tie_value_{k}"] = mask, value
        outputs = self.session.run(None, feed)
        self.shapes = [o.shape for o in outputs[1:]]
        return outputs[0][0], [o[0] for o in outputs[1:]]


def _matches(logits: np.ndarray, target: np.ndarray, tolerance: float) -> bool:
    logits, target = logits.reshape(-1).astype(np.float64), target.reshape(-1).astype(np.float64)
    close = float(np.abs(logits - target).max()) <= tolerance
    return close and logits[int(target.argmax())] >= logits.max() - tolerance


def _near_ties(sources: list[np.ndarray], tie_rtol: float) -> list[tuple[float, int, int]]:
    """(|x| / max |x|, binarization, flat index) of every near-tie, the closest first."""
    found = []
    for k, values in enumerate(sources):
        flat = np.abs(values.reshape(-1))
        scale = float(flat.max()) if flat.size else 0.0
        if scale > 0:
            near = np.flatnonzero(flat <= tie_rtol * scale)
            found += [(float(flat[i]) / scale, k, int(i)) for i in near]
    return sorted(found)


def _distance(logits: np.ndarray, target: np.ndarray) -> float:
    return float(np.square(logits.reshape(-1) - target.reshape(-1).astype(np.float64)).sum())


def search_ties(
    probe: TieProbe,
    x: np.ndarray,
    target: np.ndarray,
    tolerance: float,
    tie_rtol: float = TIE_RTOL,
    max_steps: int = MAX_STEPS,
) -> tuple[np.ndarray | None, int, float, int]:
    """Look for tie signs that make ONNX Runtime's logits on `x` match `target`.

    Greedy: each step tries the other sign at each of the `MAX_CANDIDATES` closest near-ties
    not chosen yet, one at a time on top of the signs chosen so far, then all of those that
    brought the logits closer to `target` (squared distance) together, and keeps the best; it
    stops when one matches, or when nothing brings them closer. A choice counts only if every
    chosen activation is still a near-tie in the run that matches (a sign chosen upstream moves
    the values downstream).
    Returns (matching logits or None, activations chosen, largest |x| / max |x| among them,
    runs).
    """
    chosen: dict[tuple[int, int], tuple[float, float]] = {}  # (k, index) -> (sign, |x|/max)
    logits, sources = probe.run(x, {})
    runs = 1
    if _matches(logits, target, tolerance):
        return logits, 0, 0.0, runs
    best = _distance(logits, target)
    for _ in range(max_steps):
        step_best = None
        helpful: dict[tuple[int, int], tuple[float, float]] = {}
        candidates = [c for c in _near_ties(sources, tie_rtol) if (c[1], c[2]) not in chosen]
        trials, union_tried = [], False
        for ratio, k, index in candidates[:MAX_CANDIDATES]:
            own = 1.0 if sources[k].reshape(-1)[index] >= 0 else -1.0
            trials.append({**chosen, (k, index): (-own, ratio)})
        while trials:
            trial = trials.pop(0)
            logits, seen = probe.run(x, _by_binarization(trial))
            runs += 1
            if not _still_ties(trial, seen, tie_rtol):
                continue
            if _matches(logits, target, tolerance):
                return logits, len(trial), max(r for _, r in trial.values()), runs
            distance = _distance(logits, target)
            if distance < best:
                helpful.update(trial)
            if step_best is None or distance < step_best[0]:
                step_best = (distance, trial, seen)
            if not trials and not union_tried and len(helpful) > len(chosen) + 1:
                trials.append(dict(helpful))  # ties far apart are independent: all at once
                union_tried = True
        if step_best is None or step_best[0] >= best:
            break
        best, chosen, sources = step_best
    return None, 0, 0.0, runs


def _by_binarization(
    chosen: dict[tuple[int, int], tuple[float, float]],
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The chosen signs as `TieProbe.run` takes them: per binarization, indices and signs."""
    grouped: dict[int, tuple[list[int], list[float]]] = {}
    for (k, index), (sign, _) in chosen.items():
        grouped.setdefault(k, ([], []))
        grouped[k][0].append(index)
        grouped[k][1].append(sign)
    return {
        k: (np.asarray(i, np.int64), np.asarray(v, np.float32)) for k, (i, v) in grouped.items()
    }


def _still_ties(
    chosen: dict[tuple[int, int], tuple[float, float]], sources: list[np.ndarray], tie_rtol: float
) -> bool:
    return all(
        abs(sources[k].reshape(-1)[index]) <= tie_rtol * np.abs(sources[k]).max()
        for k, index in chosen
    )


def replay_signs(
    probe: TieProbe,
    x: np.ndarray,
    witnessed: dict[str, np.ndarray],
    target: np.ndarray,
    tolerance: float,
    tie_rtol: float = TIE_RTOL,
) -> tuple[np.ndarray | None, int, float, int]:
    """Impose another runtime's signs at every binarization at once and check them.

    `witnessed` holds, by ONNX source name, the values the other runtime binarized on `x` (a
    witness: see `converters.lce.LceWitness`); its signs follow the float sign bit, as LCE's
    quantizer does. The runtimes are then the same model up to ties when, given the same signs
    upstream, ONNX Runtime would have taken the other sign only at near-ties, and the logits
    match `target`. Unlike `search_ties` this needs no guessing, so it copes with the many
    ties of a deep real-valued path (QuickNet at 224x224 meets several per sample).
    `witnessed` must hold every one of `probe.sources`. Returns what `search_ties` returns.
    """
    theirs = [np.signbit(np.asarray(witnessed[source])) for source in probe.sources]
    imposed = {k: np.where(negative, -1.0, 1.0) for k, negative in enumerate(theirs)}
    logits, sources = probe.run(x, {}, imposed)
    changed, largest = 0, 0.0
    for negative, values in zip(theirs, sources, strict=True):
        if negative.size != values.size:
            return None, 0, 0.0, 1
        differ = negative.reshape(values.shape) != (values < 0)
        if not differ.any():
            continue
        ratio = float(np.abs(values[differ]).max()) / float(np.abs(values).max())
        if not ratio <= tie_rtol:
            return None, 0, 0.0, 1
        changed += int(differ.sum())
        largest = max(largest, ratio)
    if not _matches(logits, target, tolerance):
        return None, 0, 0.0, 1
    return logits, changed, largest, 1


# a sample (C, H, W) -> (the other runtime's logits, its binarization inputs by ONNX source)
Witness = Callable[[np.ndarray], tuple[np.ndarray, dict[str, np.ndarray]]]


def explain_by_ties(
    onnx_path: str | Path,
    inputs: np.ndarray,
    onnx_outputs: np.ndarray,
    other_outputs: np.ndarray,
    rtol: float = 1e-4,
    tie_rtol: float = TIE_RTOL,
    witness: Callable[[], Witness] | None = None,
) -> tuple[np.ndarray, TieReport]:
    """ONNX Runtime's outputs with the samples that fail the comparison re-run at other tie
    signs where that explains them, and what the search found.

    `compare(resolved, other_outputs, rtol)` then holds the verdict: a sample no choice of tie
    signs explains keeps ONNX Runtime's own outputs and still fails. The search stops at the
    first such sample, so a broken model costs one sample's search, not one per sample.
    `witness` (called once, on the first failing sample) builds a `Witness` of the other
    runtime: its signs are then replayed (`replay_signs`) instead of searched for, on every
    sample where the witness's logits are the other runtime's own.
    """
    reference = np.asarray(onnx_outputs, np.float64).reshape(len(onnx_outputs), -1)
    other = np.asarray(other_outputs, np.float64).reshape(len(other_outputs), -1)
    tolerance = compare(reference, other, rtol).tolerance
    failing = [
        row for row in range(len(reference))
        if not _matches(reference[row], other[row], tolerance)
    ]  # fmt: skip
    report = TieReport(failing=len(failing))
    resolved = np.array(onnx_outputs, copy=True)
    if not failing:
        return resolved, report
    probe = TieProbe(onnx_path)
    check_input_shape(probe.input.shape, np.asarray(inputs), f"ONNX model {onnx_path}")
    witnessing = witness() if witness is not None else None
    for row in failing:
        sample = np.asarray(inputs[row], np.float32)
        found = []
        for side, target in enumerate((reference[row], other[row])):  # ONNX Runtime first
            replayed = False
            if witnessing is not None and side == 1:
                their_logits, witnessed = witnessing(sample)
                # a witness whose logits differ did not compute what was shipped: search then
                replayed = _matches(their_logits, target, tolerance) and all(
                    source in witnessed for source in probe.sources
                )
            if replayed:
                logits, changed, largest, runs = replay_signs(
                    probe, sample, witnessed, target, tolerance, tie_rtol
                )
            else:
                logits, changed, largest, runs = search_ties(
                    probe, sample, target, tolerance, tie_rtol
                )
            report.runs += runs
            if logits is None:
                break
            found.append((logits, changed, largest))
        if len(found) < 2:
            break  # the comparison fails on this sample anyway: the others need no search
        resolved[row] = found[1][0].reshape(resolved[row].shape)
        report.explained += 1
        report.rows.append(row)
        report.positions += found[0][1] + found[1][1]
        report.largest_tie = max(report.largest_tie, found[0][2], found[1][2])
    return resolved, report
