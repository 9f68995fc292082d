"""The conversion gate's checks, in the order `check_conversion` runs them.

1. No exact 0 reaches a binarization the normaliser made out of a plain Sign
   (`check_zero_free`: there the original maps 0 to 0, the flatbuffer to +1).
2. LCE against ONNX Runtime and each `Reference` (PyTorch, from bnnexport), and the float
   TFLite model against ONNX Runtime when it is written (`run_gates`): plainly, or after
   replaying the candidate's own signs (`WitnessModels`) at bounded rounding ties
   (`converters.gate.predicate`).
3. When 2 refuses: the exact-grid twin's verdict and, for a model whose binarization inputs sit
   within rounding of zero by the thousand, the InconclusiveCheckError that says so
   (`converters.gate.inconclusive`), or acceptance on the twin with `trust_twin`.
4. The exact-grid twin (`check_twin`, `converters.gate.twin`): agreement with no tie at all.

docs/ARCHITECTURE.md ("Conversion gate") gives the reasoning.

Example:
    >>> from bnnexport.converters.gate.checks import check_conversion
    >>> checked = check_conversion(onnx_path=path, model=model, translated=translated,
    ...     inputs=x, references=(), options=ConvertOptions(), zero_sensitive={},
    ...     check_float=False)                                           # doctest: +SKIP
    >>> [g.candidate for g in checked.gates]                            # doctest: +SKIP
    ['LCE']
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
from bnnexport.converters.errors import ConversionMismatchError, ZeroSignError
from bnnexport.converters.flatbuffer import input_layout, signature_outputs, to_input_layout
from bnnexport.converters.gate.agreement import compare_outputs
from bnnexport.converters.gate.inconclusive import inconclusive
from bnnexport.converters.gate.predicate import (
    UNPROBED_FLIPS,
    GateOptions,
    GateReport,
    Replay,
    SignProbe,
    Witness,
    signbit_negative,
    validate,
)
from bnnexport.converters.gate.probe import OnnxProbe
from bnnexport.converters.gate.twin import exact_grid_twin, grid_inputs
from bnnexport.converters.runtimes import (
    lce_batch_predict,
    lce_interpreter,
    probe_session,
    run_lce,
    run_onnx,
    run_tflite,
    tflite_interpreter,
)
from bnnexport.converters.translate import Translated, releasing, translate
from bnnexport.converters.translate.worker import Pending, TranslationWorker, in_background

FLOAT_CHECK_SAMPLES = 100  # the float TFLite model is a side product: a quicker check
TWIN_SAMPLES = 16  # exact-grid twin: rounding-free, so a few samples show any translation bug
# the twin's arithmetic is exact up to float ops after the last binarization (a 7x7 average):
# bit-exact for every zoo model but QuickNet-Small (docs/BENCHMARKS.md "Conversion scaling")
TWIN_RTOL = 1e-6


class Checking(Protocol):
    """How the checks run (`converters.lce.ConvertOptions` is one): the gate's thresholds,
    whether to run the exact-grid twin, whether to accept an inconclusive model on it, and a
    `step` callback announcing each step."""

    gate: GateOptions
    twin: bool
    trust_twin: bool

    def step(self, line: str) -> None: ...


@dataclass
class Checked:
    """What the checks measured: one report per real-weight comparison (LCE vs ONNX Runtime
    first, then each reference, then the float TFLite model), the twin's, and, when an
    inconclusive model was accepted on the twin (`trust_twin`), why."""

    gates: list[GateReport]
    twin: list[GateReport]
    trusted_twin: dict | None = None
    twin_seconds: float = 0.0  # the twin's translation, conversion and comparison


@dataclass
class StartedTwin:
    """The exact-grid twin of a model (`converters.gate.twin`) with its translation started
    before the model's own (`start_twin`), for the image input layout it was started for."""

    model: onnx.ModelProto
    input_layout: str
    translation: Pending


def start_twin(
    model: onnx.ModelProto, input_layout: str, worker: TranslationWorker | None
) -> StartedTwin:
    """Build the exact-grid twin of the normalised `model` and start its translation and LCE
    conversion in `worker` (`converters.translate.worker`; None: translated when checked)."""
    twin = exact_grid_twin(model)
    pending = in_background(twin, worker, float_model=False, input_layout=input_layout)
    return StartedTwin(twin, input_layout, pending)


def check_conversion(
    *,
    onnx_path: Path | bytes,
    model: onnx.ModelProto,
    translated: Translated,
    inputs: np.ndarray,
    references: Sequence[Reference],
    options: Checking,
    zero_sensitive: dict[str, float],
    check_float: bool,
    started_twin: StartedTwin | None = None,
) -> Checked:
    """Run the checks in order (module doc) on the normalised `model` and its `translated`
    flatbuffers; `onnx_path` is what ONNX Runtime runs as the reference; `started_twin`, the
    twin whose translation `start_twin` started. Raises the first refusal: ZeroSignError,
    ConversionMismatchError or InconclusiveCheckError."""
    options.step(f"gate: LCE against {len(references) + 1} reference(s) on {len(inputs)} samples")
    check_zero_free(model, zero_sensitive, inputs, "check sample")
    layout = translated.input_layout or "nchw"  # the twin is translated as the flatbuffer is
    twin: list[GateReport] | None = None
    trusted = None
    with releasing(model.ByteSize()):  # the gate's sessions and interpreters, before the twin's
        try:
            gates = run_gates(onnx_path, model, translated, inputs, references, options.gate,
                              check_float)  # fmt: skip
        except ConversionMismatchError as error:
            gates, twin, trusted = _refused(
                error, model, inputs, references, options, (layout, started_twin)
            )
    start = time.perf_counter()
    if options.twin and twin is None:
        options.step("exact-grid twin: convert and compare")
        twin = check_twin(model, inputs, references, options.gate, layout, started_twin)
    return Checked(gates, twin or [], trusted, time.perf_counter() - start)


@dataclass
class Reference:
    """A model the flatbuffer must match besides ONNX Runtime (bnnexport passes PyTorch).

    `outputs(inputs)` runs it on the check inputs (called after ONNX Runtime has checked their
    shape); `probe` builds a `SignProbe` of it (for the tie replay);
    `twin_outputs(twin_model, twin_inputs)` runs its own exact-grid twin, and
    `twin_probe(twin_model)` builds a `SignProbe` of that twin (`check_twin`).
    """

    name: str
    outputs: Callable[[np.ndarray], np.ndarray]
    probe: Callable[[], SignProbe] | None = None
    twin_outputs: Callable[[onnx.ModelProto, np.ndarray], np.ndarray] | None = None
    twin_probe: Callable[[onnx.ModelProto], SignProbe] | None = None
    # why no `probe` could be built: the reference is then checked through ONNX Runtime
    # (`through_onnx`); None with no probe: every sample must agree plainly
    unprobed: str | None = None


class WitnessModels:
    """The model translated again with every binarization's input as an extra output, converted
    with LCE and with the stock TFLite converter: witnesses of what each flatbuffer binarizes.

    The extra outputs can stop LCE fusing a bconv with the binarization after it, so a witness
    is not the shipped flatbuffer; the gate uses it only on samples where its logits are the
    shipped flatbuffer's own. It takes its input in the shipped flatbuffer's `input_layout`.
    Built on first use: most conversions meet no tie.
    """

    def __init__(
        self, model: onnx.ModelProto, float_model: bool = True, input_layout: str | None = None
    ):
        self.model = model
        self.float_model = float_model  # False: LCE's witness only (an int8 model's)
        self.input_layout = input_layout or "nchw"
        self._flatbuffers: dict[str, bytes] | None = None
        self.sources: list[str] = []

    def _convert(self) -> dict[str, bytes]:
        if self._flatbuffers is None:
            translated = translate(self.model, float_model=self.float_model, witness=True,
                                   input_layout=self.input_layout)  # fmt: skip
            self.sources = translated.info.witness_sources
            self._flatbuffers = {
                "LCE": translated.flatbuffer, "float TFLite": translated.float_flatbuffer or b""
            }  # fmt: skip
        return self._flatbuffers

    def witness(self, runtime: str) -> Witness:
        """The `Witness` of "LCE" (sign-bit rule) or "float TFLite" (x < 0 rule)."""
        state: dict[str, Callable] = {}

        def run(x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
            if not state:
                state["run"] = _named_outputs(self._convert()[runtime], runtime)
            outputs = state["run"](x[None].astype(np.float32))
            by_source = {s: outputs[f"witness_{k:03d}"][0] for k, s in enumerate(self.sources)}
            return outputs["output_0"][0], by_source

        negative = signbit_negative if runtime == "LCE" else (lambda v: np.asarray(v) < 0)
        return Witness(run=run, negative=negative)


def _named_outputs(flatbuffer: bytes, runtime: str) -> Callable[[np.ndarray], dict]:
    """A runner returning a flatbuffer's outputs by signature name (LCE reorders them), on an
    NCHW sample given the flatbuffer's input layout."""
    layout = input_layout(flatbuffer)
    if runtime == "LCE":
        order = signature_outputs(flatbuffer)
        interpreter = lce_interpreter(flatbuffer)
        batch = int(interpreter.input_shapes[0][0])
        if batch == 1:
            return lambda x: dict(
                zip(order, interpreter.predict(to_input_layout(x, layout)), strict=True)
            )
        # a batch-N copy (converters.batch): the one sample repeated, its first row kept
        whole = lce_batch_predict(interpreter)
        return lambda x: {
            k: v[:1]
            for k, v in zip(
                order, whole([to_input_layout(np.repeat(x, batch, axis=0), layout)]), strict=True
            )
        }
    runner = tflite_interpreter(flatbuffer).get_signature_runner()
    return lambda x: runner(input_0=to_input_layout(x, layout))


def binarization_inputs(
    model: onnx.ModelProto, sources: Sequence[str], inputs: np.ndarray
) -> dict[str, np.ndarray]:
    """ONNX Runtime's values of tensors `sources` of `model` on `inputs` (one sample at a
    time, so a model whose batch was fixed to 1 takes any number of samples)."""
    session, batch = probe_session(model, sources)
    first = session.get_inputs()[0]
    names = list(sources)
    found: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for x in np.asarray(inputs, np.float32):  # a fixed batch gets the sample repeated
        feed = {first.name: np.repeat(x[None], batch, axis=0)}
        for name, value in zip(names, session.run(names, feed), strict=True):
            found[name].append(value[:1])
    return {n: np.stack(v) for n, v in found.items()}


def check_zero_free(
    model: onnx.ModelProto, zero_sensitive: dict[str, float], inputs: np.ndarray, what: str
) -> None:
    """ZeroSignError unless no exact 0 (or -0.0) reaches a binarization the normaliser made out
    of a plain Sign (or `x > 0`): there the original maps 0 to 0 (or -1), the flatbuffer to +1.
    Everywhere else the two are the same function, so on `inputs` they agree exactly."""
    if not zero_sensitive:
        return
    values = binarization_inputs(model, list(zero_sensitive), inputs)
    for source, value in values.items():
        zeros = np.argwhere(value.reshape(len(value), -1) == 0)
        if len(zeros):
            raise ZeroSignError(
                f"{len(zeros)} exact zero(s) reach the plain Sign of {source!r} on {what} "
                f"{int(zeros[0][0])}: it maps 0 to {zero_sensitive[source]:g}, which LCE's "
                "1-bit activations cannot hold; binarize with sign(sign(x) + 0.1) or "
                "where(x >= 0, 1, -1) (sign(0) = +1) and export again"
            )


def check_twin(
    model: onnx.ModelProto,
    inputs: np.ndarray,
    references: Sequence[Reference],
    options: GateOptions,
    input_layout: str = "nchw",
    started: StartedTwin | None = None,
) -> list[GateReport]:
    """Convert the exact-grid twin of `model` (its image input in `input_layout`, as the
    flatbuffer it stands for; `started`'s translation where it was started for that layout)
    and require LCE to agree with ONNX Runtime and
    each reference's own twin with no tie at all (`converters.gate.twin`). The twin's inputs of
    binarizations made from a plain Sign are not required to be zero-free: the twin is built
    from the normalised graph, where both runtimes map 0 to +1 there, so its (common) exact
    zeros test how the translator breaks them; whether the real model meets a zero is shown
    on the real samples (`check_zero_free`)."""
    if started is None or started.input_layout != input_layout:
        started = start_twin(model, input_layout, None)  # translated here, on `result()`
    twin, flatbuffer = started.model, started.translation.result().flatbuffer
    x = grid_inputs(inputs[:TWIN_SAMPLES])
    lce_out = run_lce(flatbuffer, x)
    strict = GateOptions(rtol=min(options.rtol, TWIN_RTOL))  # no probe: no replay, no tie
    ort_out = run_onnx(twin.SerializeToString(), x)
    reports = [validate(ort_out, lce_out, x, strict, ("ONNX Runtime twin", "LCE twin"))]
    for ref in references:
        if ref.twin_outputs is not None:
            reports.append(_reference_twin(ref, twin, x, (ort_out, lce_out), options))
    return reports


def _reference_twin(
    ref: Reference,
    twin: onnx.ModelProto,
    x: np.ndarray,
    twin_outputs: tuple[np.ndarray, np.ndarray],
    options: GateOptions,
) -> GateReport:
    """The reference's own twin against LCE's, with no tie. Where that fails and the reference
    can probe its twin, the twin's float sums were too large to stay exact in float32 (Bi-Real-
    Net's float shortcut convs over a residual stream of a few hundred, at 224x224): the
    reference rounds them its own way. LCE's twin equals ONNX Runtime's with no tie (checked
    just before), so the reference is then compared with ONNX Runtime's twin, as the export
    gate compares it on real weights: a tie replay, both sides reference runtimes."""
    ort_out, lce_out = twin_outputs
    strict = GateOptions(rtol=min(options.rtol, TWIN_RTOL))
    try:
        ref_out = ref.twin_outputs(twin, x)
        return validate(ref_out, lce_out, x, strict, (f"{ref.name} twin", "LCE twin"))
    except ConversionMismatchError:
        if ref.twin_probe is None:
            raise
    # the reference's outputs through its probe, one sample at a time, so the outputs judged
    # and the model replayed are one computation (a batch may round otherwise: torch does)
    ref_probe = ref.twin_probe(twin)
    ref_out = np.stack([np.asarray(ref_probe.run(sample)[0]) for sample in x])
    replay = Replay(lambda: ref_probe, OnnxProbe(twin).witness(), judged=frozenset())
    names = (f"{ref.name} twin", "ONNX Runtime twin (= LCE twin)")
    return validate(ref_out, ort_out, x, options, names, replay)


def twin_verdict(
    model: onnx.ModelProto,
    inputs: np.ndarray,
    references: Sequence[Reference],
    options: Checking,
    input_layout: str = "nchw",
    started: StartedTwin | None = None,
) -> tuple[list[GateReport] | None, str]:
    """(the twin's reports, or None when it failed or did not run; what it said, in words)."""
    if not options.twin:
        return None, "not run (twin check disabled)"
    options.step("exact-grid twin: convert and compare")
    try:
        reports = check_twin(model, inputs, references, options.gate, input_layout, started)
    except ConversionMismatchError as error:
        return None, f"failed: {error}"
    worst = max(r.max_abs_diff for r in reports)
    return reports, f"passed ({len(reports)} comparisons, no tie, max |diff| {worst:.3g})"


def _refused(
    error: ConversionMismatchError,
    model: onnx.ModelProto,
    inputs: np.ndarray,
    references: Sequence[Reference],
    options: Checking,
    twin_for: tuple[str, StartedTwin | None],
) -> tuple[list[GateReport], list[GateReport] | None, dict]:
    """After the real-weight gate refused: run the twin (`twin_for`: the input layout, the
    started twin) and raise `error`, with the twin's
    verdict in its diagnostics, or the InconclusiveCheckError that explains it (a degenerate
    model, `converters.gate.inconclusive`). With `options.trust_twin`, an inconclusive model
    whose twin passes is accepted: returns (no gate reports, the twin's, the record)."""
    twin, said = twin_verdict(model, inputs, references, options, *twin_for)
    rows = error.diagnostics.get("failing_samples") or list(range(len(inputs)))
    found = inconclusive(error, OnnxProbe(model), inputs, rows, options.gate, said)
    if found is None:
        raise error
    if not (options.trust_twin and twin is not None):
        raise found from None
    options.step("real-weight check inconclusive: accepted on the exact-grid twin (--trust-twin)")
    return [], twin, {**found.diagnostics, "inconclusive": str(found)}


def run_gates(
    onnx_path: Path | bytes,
    model: onnx.ModelProto,
    translated: Translated,
    inputs: np.ndarray,
    references: Sequence[Reference],
    options: GateOptions,
    check_float: bool,
) -> list[GateReport]:
    """LCE against ONNX Runtime and each reference; the float TFLite model against ONNX
    Runtime when it is written. One ONNX Runtime probe and one witness conversion, on demand.
    Recurring splits are judged where the translator decides signs exactly
    (`TranslationInfo.exact_sources`), each reference arbitrating the others'."""
    # the float one only if checked; both take the input as the flatbuffer does
    witnesses = WitnessModels(model, float_model=check_float, input_layout=translated.input_layout)
    probes: dict[str, SignProbe] = {}

    def onnx_probe() -> SignProbe:
        if "onnx" not in probes:
            probes["onnx"] = OnnxProbe(model)
        return probes["onnx"]

    judged = frozenset(translated.info.exact_sources)
    onnx_outputs = run_onnx(onnx_path, inputs)
    lce_outputs = run_lce(translated.flatbuffer, inputs)
    lce_witness = witnesses.witness("LCE")
    # each reference's probe arbitrates the values the others split on (converters.gate)
    arbiters = [onnx_probe, *(ref.probe for ref in references if ref.probe is not None)]
    replay = Replay(onnx_probe, lce_witness, arbiters[1:], judged)
    gates = [validate(onnx_outputs, lce_outputs, inputs, options, ("ONNX Runtime", "LCE"), replay)]
    for ref in references:
        found = ref.outputs(inputs)
        if ref.probe is None and ref.unprobed is not None:
            gates.append(through_onnx(found, onnx_outputs, lce_outputs, inputs, options, ref))
            continue
        others = [a for a in arbiters if a is not ref.probe]
        replay = None if ref.probe is None else Replay(ref.probe, lce_witness, others, judged)
        gates.append(validate(found, lce_outputs, inputs, options, (ref.name, "LCE"), replay))
    if check_float:
        few = slice(0, FLOAT_CHECK_SAMPLES)
        gates.append(
            validate(
                onnx_outputs[few],
                run_tflite(translated.float_flatbuffer, inputs[few]),
                inputs[few],
                options,
                ("ONNX Runtime", "float TFLite"),
                Replay(onnx_probe, witnesses.witness("float TFLite"), arbiters[1:], judged),
            )
        )
    return gates


def through_onnx(
    found: np.ndarray,
    onnx_outputs: np.ndarray,
    lce_outputs: np.ndarray,
    inputs: np.ndarray,
    options: GateOptions,
    ref: Reference,
) -> GateReport:
    """A reference no sign probe can be built for (`Reference.unprobed` says why) against LCE,
    through ONNX Runtime: it must agree with ONNX Runtime plainly (no tie between the two can be
    replayed: predictions alone are judged then, one may differ, as the export gate judges
    such a model), and LCE with ONNX Runtime was already proven sample by
    sample, its ties replayed (`run_gates`), so the chain reference -> ONNX -> LCE holds on
    each sample. The report keeps the plain numbers against LCE; after them, the weaker of the
    two links."""
    names = (ref.name, "ONNX Runtime")
    unprobed = replace(options, unprobed_flips=UNPROBED_FLIPS)  # as the export gate judges it
    try:
        link = validate(found, onnx_outputs, inputs, unprobed, names)
    except ConversionMismatchError as error:
        raise ConversionMismatchError(
            f"{error} ({ref.name}'s signs cannot be replayed: {ref.unprobed})",
            {**error.diagnostics, "unprobed": ref.unprobed},
        ) from None
    direct = compare_outputs(found, lce_outputs, options.rtol)
    onnx_vs_lce = compare_outputs(onnx_outputs, lce_outputs, options.rtol)
    return GateReport(
        reference=ref.name, candidate="LCE", samples=direct.samples,
        tolerance=direct.tolerance, plain_argmax_agreement=direct.argmax_agreement,
        plain_max_abs_diff=direct.max_abs_diff,
        argmax_agreement=min(link.argmax_agreement, onnx_vs_lce.argmax_agreement),
        max_abs_diff=max(link.max_abs_diff, onnx_vs_lce.max_abs_diff),
        through=f"ONNX Runtime ({ref.unprobed})",
    )  # fmt: skip
