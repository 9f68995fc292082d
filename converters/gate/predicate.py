"""The conversion gate: is a candidate runtime the same model as a reference, up to rounding?

`validate` compares a candidate's outputs (ONNX Runtime at export; LCE's or the float TFLite
flatbuffer at convert) with a reference's (PyTorch, ONNX Runtime) on the check samples and
raises `ConversionMismatchError` unless every sample agrees within `rtol` of the reference's
logit range, either plainly or after a *sign-tie replay*:

- Two runtimes sum the same values in different orders, so a binarization input within float
  rounding of zero can get +1 in one and -1 in the other; every later layer then differs. For a
  sample that fails the plain comparison, the candidate's **witness** (the same model, also
  outputting every binarization's input) tells which sign it took at each binarization. Those
  signs are imposed all at once in the reference (`SignProbe.run`), and the sample passes only
  if the reference's logits then match the candidate's and every sign that had to be imposed
  against the reference's own choice is a **tie**:

  - the value is not exactly zero in both runtimes: an exact 0 or -0.0 in both, decided
    differently, is a convention (LCE packs the IEEE sign bit; torch maps both zeros to +1),
    never rounding, and always a mismatch. (A float sum can round to exactly 0.0 in one runtime
    while the other has -4e-8: QuickNet's float stem at 224x224 does that; it is a tie.);
  - |x| <= `tie_rtol` x the largest |x| of that binarization's input, in both runtimes;
  - at most `max(MIN_TIES, tie_fraction x size)` such positions per binarization and sample:
    rounding meets a handful, a converter bug meets thousands.

- A value that recurs is a *fixed* value: the same value (bit for bit, in both runtimes) of one
  channel of one binarization decided differently on two different inputs is a function of
  the parameters and of integer accumulators, not an accident of one sample's sums. Where the
  candidate decides such values by a rule of its own (`Replay.judged`: the translator's
  binary-conv accumulators under a per-channel affine map, whose signs it fixes in float64),
  deciding one apart from the reference is wrong wherever it occurs (the converter with its
  tie-break removed does that in BinaryNet: one BatchNorm threshold 1.6e-6 from an integer,
  35 positions on 14 of 16 samples, each alone within rounding). Unless the references
  themselves split on it: a third runtime, an *arbiter* (`Replay.arbiters`, the other
  references), given the same upstream signs, that decides it as the candidate does makes it
  a tie. A float value (a residual sum, a float stem) that recurs is rounded, not decided: a
  correct translator that folds a BatchNorm rounds it its own way on every sample (QuickNet
  at 224x224 does: a residual sum 8e-6 in ONNX Runtime and PyTorch, -2.1e-5 in LCE).
- There is no rule on plain agreement: a single tie early in a deep network may change a
  prediction the reference is fairly sure of, and the replay judges that sample like any other.
  How many such predictions changed is reported (`sure_predictions`, `sure_changed`).
- Zero compared samples is a failure, not agreement 1.0.

A refusal's `ConversionMismatchError.diagnostics` say what the gate saw
(`mismatch_diagnostics`); `converters.gate.inconclusive` tells a degenerate model (binarization
inputs within rounding of zero by the thousand, which no comparison on real weights can decide)
from a wrong conversion.

The report keeps the plain numbers beside the resolved ones (docs/ARCHITECTURE.md, "Conversion
gate").

Example:
    >>> import numpy as np
    >>> from bnnexport.converters.gate import GateOptions, validate
    >>> ref = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
    >>> report = validate(ref, ref + 1e-6, np.zeros((2, 1)), GateOptions(), names=("a", "b"))
    >>> report.plain_argmax_agreement, report.tie_samples
    (1.0, [])
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
from bnnexport.converters.errors import ConversionMismatchError
from bnnexport.converters.gate.agreement import RTOL, compare_outputs

TIE_RTOL = 1e-5  # a tie: |x| <= TIE_RTOL x the largest |x| of that binarization's input
TIE_FRACTION = 1e-3  # at most this fraction of a binarization's activations may tie ...
MIN_TIES = 2  # ... or this many, whichever is larger, per sample
# reported only: predictions whose reference top-1 margin is at least this fraction of the range
CONFIDENT_MARGIN = 0.05
# a reference no replay can probe (`GateOptions.unprobed_flips`): one rounding tie may change
# one prediction
UNPROBED_FLIPS = 1


@dataclass(frozen=True)
class GateOptions:
    """The gate's thresholds (see the module docstring)."""

    rtol: float = RTOL
    tie_rtol: float = TIE_RTOL
    tie_fraction: float = TIE_FRACTION
    confident_margin: float = CONFIDENT_MARGIN
    # Without a replay, judge predictions only and let this many differ (None: every sample
    # must agree within rtol). For a reference no replay can probe: PyTorch running a module of
    # your own, whose binarizations bnnexport cannot see; there a rounding tie moves logits
    # freely and may change one prediction. The flatbuffer itself is still gated against
    # ONNX Runtime with the replay.
    unprobed_flips: int | None = None

    def tie_bound(self, size: int) -> int:
        """Most tie positions allowed in one binarization input of `size` activations."""
        return max(MIN_TIES, math.ceil(self.tie_fraction * size))


class SignProbe(Protocol):
    """A reference model that can be re-run with chosen signs at its binarizations."""

    sources: list[str]  # the binarization inputs, by ONNX tensor name, in compute order

    def run(
        self, x: np.ndarray, imposed: list[np.ndarray] | None = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """(logits, binarization inputs) for one sample `x` (no batch axis); `imposed` gives,
        per source, the ±1 signs to use instead of the computed ones."""
        ...


@dataclass
class Witness:
    """A candidate's own view of one sample: `run(x)` -> (logits, binarization inputs by ONNX
    source name); `negative(values)` says which values that runtime binarizes to -1."""

    run: Callable[[np.ndarray], tuple[np.ndarray, dict[str, np.ndarray]]]
    negative: Callable[[np.ndarray], np.ndarray] = field(default=lambda v: np.asarray(v) < 0)


def signbit_negative(values: np.ndarray) -> np.ndarray:
    """LCE's rule: its kernels pack the IEEE sign bit, so -0.0 becomes -1."""
    return np.signbit(np.asarray(values))


@dataclass
class Replay:
    """What the sign-tie replay of `validate` needs (module doc): the reference's `probe`
    (built only when a sample needs a replay), the candidate's `witness`, `arbiters` (other
    references' probes, built on demand) that tell a fixed value the references themselves
    split on from one the candidate decides by a rule of its own, and `judged`, the
    binarization inputs where a recurring split is judged at all: those the candidate decides
    by a rule of its own (`TranslationInfo.exact_sources`); None: every one; empty: none (the
    candidate is a reference runtime)."""

    probe: Callable[[], SignProbe]
    witness: Witness
    arbiters: Sequence[Callable[[], SignProbe]] = ()
    judged: frozenset[str] | None = None


@dataclass
class GateReport:
    """One comparison of a candidate with a reference, before and after tie replay."""

    reference: str
    candidate: str
    samples: int
    tolerance: float
    plain_argmax_agreement: float
    plain_max_abs_diff: float
    argmax_agreement: float  # after replaying the candidate's signs on the tie samples
    max_abs_diff: float
    tie_samples: list[int] = field(default_factory=list)
    tie_positions: int = 0  # signs imposed against the reference's own, over all samples
    tie_largest: float = 0.0  # largest |x| / max |x| among them (either runtime)
    sure_predictions: int = 0  # reference top-1 margin >= confident_margin x its logit range
    sure_changed: int = 0  # of those, how many the candidate predicts otherwise (plain)
    # a reference no replay could probe, checked through a third runtime: which, and why
    # (`converters.gate.checks.through_onnx`); None: compared directly
    through: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SignDiff:
    """The signs of one binarization, on one sample, that a replay imposed against the
    reference's own choice."""

    source: str
    positions: int
    size: int
    largest: float  # largest |x| / max |x| of the tensor among them, in either runtime
    exact_zeros: int  # of them, exactly 0 (or -0.0) in both runtimes
    reference_largest: float = 0.0  # as `largest`, in the reference alone
    # (flat position, channel, reference value, candidate value) of each, in compute order
    cells: list[tuple[int, int, float, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The summary, without the per-position cells."""
        return {k: v for k, v in asdict(self).items() if k != "cells"}


class _Mismatch(Exception):
    """A sample no sign-tie replay explains (turned into ConversionMismatchError)."""

    def __init__(self, why: str, diffs: list[SignDiff] | None = None):
        super().__init__(why)
        self.diffs = diffs or []


MAX_CELLS = 1000  # per binarization and sample: more is refused by the tie bound anyway


def _matches(logits: np.ndarray, target: np.ndarray, tolerance: float) -> bool:
    logits, target = (np.asarray(a, np.float64).reshape(-1) for a in (logits, target))
    close = float(np.abs(logits - target).max()) <= tolerance
    return close and logits[int(target.argmax())] >= logits.max() - tolerance


def _confident_flips(
    ref: np.ndarray, out: np.ndarray, tolerance: float, margin: float
) -> tuple[int, int]:
    """(samples whose reference top-1 margin is >= `margin` x the logit range, how many of them
    the candidate predicts otherwise). Reported, never a reason to refuse."""
    span = float(ref.max() - ref.min()) if ref.size else 0.0
    top = np.sort(ref, axis=1)
    sure = np.ones(len(ref), dtype=bool)  # one output: nothing to be unsure between
    if ref.shape[1] > 1:
        sure = top[:, -1] - top[:, -2] >= margin * span
    picked = ref[np.arange(len(ref)), out.argmax(axis=1)]
    changed = picked < ref.max(axis=1) - tolerance
    return int(sure.sum()), int((sure & changed).sum())


def _relative(values: np.ndarray, at: np.ndarray) -> float:
    """Largest |values[at]| over the largest |values| (inf for an all-zero tensor)."""
    top = float(np.abs(values).max())
    return float(np.abs(values[at]).max()) / top if top > 0 else math.inf


def _channel(flat: Any, tensor: np.ndarray) -> Any:
    """The channel (axis 0, or the feature) of flat position(s) `flat` of `tensor`."""
    return flat // (tensor.size // tensor.shape[0])


def _sign_diff(source: str, their: np.ndarray, mine: np.ndarray, signs: np.ndarray) -> SignDiff:
    """Where the imposed `signs` go against the reference's own (`mine`); `their` is the
    candidate's value of the same binarization input."""
    if their.size != mine.size:
        raise _Mismatch(f"binarization input {source!r} has another size in the witness")
    their = their.reshape(mine.shape)
    differ = (signs.reshape(mine.shape) < 0) != (mine < 0)
    count = int(differ.sum())
    diff = SignDiff(source, count, int(mine.size), 0.0, 0)
    if count:
        diff.reference_largest = _relative(mine, differ)
        diff.largest = max(diff.reference_largest, _relative(their, differ))
        diff.exact_zeros = int(((mine == 0) & (their == 0) & differ).sum())
        flat = np.flatnonzero(differ)[:MAX_CELLS]
        channel = _channel(flat, mine)
        found = zip(flat, channel, mine.reshape(-1)[flat], their.reshape(-1)[flat], strict=True)
        diff.cells = [(int(p), int(c), float(m), float(t)) for p, c, m, t in found]
    return diff


def _judge(diff: SignDiff, options: GateOptions, diffs: list[SignDiff]) -> None:
    """_Mismatch unless every sign of `diff` is a rounding tie (module doc)."""
    source, bound = diff.source, options.tie_bound(diff.size)
    if diff.positions > bound:
        raise _Mismatch(
            f"{diff.positions} signs of {source!r} differ (at most {bound} of {diff.size} may "
            "be rounding ties)", diffs,
        )  # fmt: skip
    if diff.exact_zeros:
        raise _Mismatch(
            f"an exact zero of {source!r} is binarized differently (a sign convention, not "
            "rounding)", diffs,
        )  # fmt: skip
    if not diff.largest <= options.tie_rtol:
        raise _Mismatch(
            f"a sign of {source!r} differs at {diff.largest:.2g} of its largest value, not a tie",
            diffs,
        )


def _replay(
    probe: SignProbe,
    witness: Witness,
    x: np.ndarray,
    target: np.ndarray,
    tolerance: float,
    options: GateOptions,
    judged: frozenset[str] | None,
) -> tuple[np.ndarray, list[SignDiff], dict[str, np.ndarray]]:
    """Impose the witness's signs in the probe on one sample; (logits, the differing signs of
    each binarization that has any, the signs imposed by source). Outside `judged` (where the
    candidate's values are its own: a tie-broken accumulator), the values must agree too."""
    logits, witnessed = witness.run(x)
    if not _matches(logits, target, tolerance):
        raise _Mismatch("its witness computes other logits than the candidate itself")
    missing = [s for s in probe.sources if s not in witnessed]
    if missing:
        raise _Mismatch(f"its witness lacks binarization input {missing[0]!r}")
    theirs = [np.asarray(witnessed[s]) for s in probe.sources]
    imposed = [np.where(witness.negative(v), -1.0, 1.0).astype(np.float32) for v in theirs]
    replayed, ours = probe.run(x, imposed)
    diffs = []
    for source, their, mine, signs in zip(probe.sources, theirs, ours, imposed, strict=True):
        diff = _sign_diff(source, their, mine, signs)
        if diff.positions:
            diffs.append(diff)
            _judge(diff, options, diffs)
        if judged is not None and source not in judged:
            _same_values(source, their, mine, options.rtol, diffs)
    if not _matches(replayed, target, tolerance):
        worst = float(np.abs(replayed.reshape(-1) - target.reshape(-1)).max())
        raise _Mismatch(
            f"with the candidate's signs the reference still differs by {worst:.3g}", diffs
        )
    return replayed, diffs, dict(zip(probe.sources, imposed, strict=True))


def _same_values(
    source: str, their: np.ndarray, mine: np.ndarray, rtol: float, diffs: list[SignDiff]
) -> None:
    """_Mismatch unless the candidate's value of every input of one binarization is within
    `rtol` of the tensor's largest |value| of the reference's: with the same signs upstream,
    the two compute the same float function, so a tie changes signs, never values."""
    their = np.asarray(their, np.float64).reshape(mine.shape)
    gaps = np.nan_to_num(np.abs(their - mine), nan=np.inf)
    top, worst = float(np.abs(mine).max()), int(gaps.argmax())
    if gaps.flat[worst] <= rtol * top:
        return
    channel = _channel(worst, mine)
    raise _Mismatch(
        f"with the same signs upstream, input {worst} (channel {channel}) of {source!r} is "
        f"{their.flat[worst]:.6g} in the candidate and {mine.flat[worst]:.6g} in the "
        f"reference ({gaps.flat[worst] / max(top, 1e-30):.2g} of its largest value): a value "
        "computed otherwise, not a sign tie", diffs,
    )  # fmt: skip


def _without_replay(
    report: GateReport, ref: np.ndarray, out: np.ndarray, failing: list[int], options: GateOptions
) -> None:
    """ConversionMismatchError naming the worst difference, unless `options.unprobed_flips`
    allows the predictions that changed (`GateOptions`)."""
    what = f"{report.candidate} vs {report.reference} disagree on {len(failing)} samples"
    allowed = options.unprobed_flips
    if allowed is not None:
        flips = round((1.0 - report.plain_argmax_agreement) * report.samples)
        if flips <= allowed:
            return
        what = f"{what} ({flips} predictions differ; without a replay at most {allowed} may)"
    gaps = np.nan_to_num(np.abs(ref - out), nan=np.inf)  # a NaN output is the worst
    sample, index = np.unravel_index(int(gaps.argmax()), gaps.shape)
    raise ConversionMismatchError(
        f"{what}: plain argmax agreement {report.plain_argmax_agreement:.2%} on "
        f"{report.samples} samples, max |diff| {report.plain_max_abs_diff:.3g} (tolerance "
        f"{report.tolerance:.3g}); worst at sample {sample}, output {index}: "
        f"{ref[sample, index]:.6g} vs {out[sample, index]:.6g}",
        mismatch_diagnostics(report, failing, None, "no replay: every sample must agree"),
    )


class _Recurrence:
    """Remembers, over every replayed sample, each (binarization, channel, reference value,
    candidate value) a replay decided differently, and on which inputs: a value seen on two
    inputs is fixed, and a tie only where an arbiter splits with the reference on it (module
    doc). (Within one input a value may appear at several positions as copies of one
    computation: a max-pool's overlapping windows pick the same element.)"""

    def __init__(self, replay: Replay) -> None:
        self.seen: dict[tuple[str, int, float, float], dict[str, int]] = {}
        self.arbiters, self.judged, self.built = list(replay.arbiters), replay.judged, {}
        self.excused: set[tuple[str, int, float, float]] = set()

    def add(self, row: int, x: np.ndarray, diffs: list[SignDiff], signs: dict[str, np.ndarray]):
        """Record sample `row` (input `x`, replayed with the candidate's `signs` by source);
        _Mismatch at the first value seen on two inputs that no arbiter decides as the
        candidate."""
        digest = hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest()
        runs: dict[int, list[np.ndarray]] = {}  # each arbiter runs this sample at most once
        for diff in diffs:
            if self.judged is not None and diff.source not in self.judged:
                continue
            for position, channel, mine, their in diff.cells:
                key = (diff.source, channel, mine, their)
                where = self.seen.setdefault(key, {})
                where.setdefault(digest, row)
                if len(where) < 2 or key in self.excused:
                    continue
                if not self._split(diff.source, position, x, signs, runs):
                    raise _Mismatch(
                        f"the same value of {diff.source!r} channel {channel} ({mine:.3g}; "
                        f"{their:.3g} in the candidate) is binarized differently on samples "
                        f"{sorted(where.values())}: a fixed value decided by another rule, "
                        "not a rounding tie (ties do not recur, and no other reference decides "
                        "it as the candidate)", diffs,
                    )  # fmt: skip
                self.excused.add(key)

    def _split(
        self,
        source: str,
        position: int,
        x: np.ndarray,
        signs: dict[str, np.ndarray],
        runs: dict[int, list[np.ndarray]],
    ) -> bool:
        """Whether an arbiter, given the candidate's signs upstream, takes the candidate's sign
        (not the reference's) at `position` of `source`; `runs` caches each arbiter's values
        on `x`."""
        for k, build in enumerate(self.arbiters):
            if k not in self.built:
                self.built[k] = build()
            arbiter = self.built[k]
            if source not in arbiter.sources or not set(arbiter.sources) <= set(signs):
                continue  # it binarizes elsewhere than the reference: no common ground
            if k not in runs:
                runs[k] = arbiter.run(x, [signs[s] for s in arbiter.sources])[1]
            values = runs[k]
            own = np.asarray(values[arbiter.sources.index(source)]).reshape(-1)[position] < 0
            if bool(own) == bool(signs[source].reshape(-1)[position] < 0):
                return True
        return False


def validate(
    reference: np.ndarray,
    candidate: np.ndarray,
    inputs: np.ndarray,
    options: GateOptions = GateOptions(),
    names: tuple[str, str] = ("reference", "candidate"),
    replay: Replay | None = None,
) -> GateReport:
    """Check `candidate` outputs against `reference` outputs on `inputs` (see module doc).

    `replay` explains samples that differ by sign ties; without it every sample must agree
    plainly.
    Raises `ConversionMismatchError` naming the worst sample and what failed; its
    `diagnostics` say which samples, which binarization first differs, how many positions and
    how far from zero (`mismatch_diagnostics`).
    """
    if len(reference) == 0 or len(candidate) == 0:
        raise ConversionMismatchError(f"{names[1]} vs {names[0]}: no samples were compared")
    ref = np.asarray(reference, np.float64).reshape(len(reference), -1)
    out = np.asarray(candidate, np.float64).reshape(len(candidate), -1)
    report = _plain_report(ref, out, options, names)
    failing = [r for r in range(len(ref)) if not _matches(ref[r], out[r], report.tolerance)]
    if not failing:
        return report
    if replay is None:
        _without_replay(report, ref, out, failing, options)
        return report
    resolved = _replay_failing(report, ref, out, inputs, failing, replay, options)
    after = compare_outputs(resolved, out, options.rtol)
    report.argmax_agreement, report.max_abs_diff = after.argmax_agreement, after.max_abs_diff
    return report


def _plain_report(
    ref: np.ndarray, out: np.ndarray, options: GateOptions, names: tuple[str, str]
) -> GateReport:
    """The report of the plain comparison, before any replay: its numbers are also the
    resolved ones until a replay resolves a sample."""
    plain = compare_outputs(ref, out, options.rtol)
    report = GateReport(
        reference=names[0], candidate=names[1], samples=plain.samples,
        tolerance=plain.tolerance, plain_argmax_agreement=plain.argmax_agreement,
        plain_max_abs_diff=plain.max_abs_diff, argmax_agreement=plain.argmax_agreement,
        max_abs_diff=plain.max_abs_diff,
    )  # fmt: skip
    sure, flips = _confident_flips(ref, out, plain.tolerance, options.confident_margin)
    report.sure_predictions, report.sure_changed = sure, flips
    return report


def _replay_failing(
    report: GateReport,
    ref: np.ndarray,
    out: np.ndarray,
    inputs: np.ndarray,
    failing: list[int],
    replay: Replay,
    options: GateOptions,
) -> np.ndarray:
    """The reference's logits with each `failing` sample replaced by its replay's, the ties
    counted in `report`; ConversionMismatchError at the first sample no replay resolves."""
    numbers = (
        f"plain argmax agreement {report.plain_argmax_agreement:.2%} on {report.samples} "
        f"samples, max |diff| {report.plain_max_abs_diff:.3g} (tolerance {report.tolerance:.3g})"
    )
    resolved = ref.copy()
    sign_probe, recurrence = replay.probe(), _Recurrence(replay)
    for row in failing:
        sample = np.asarray(inputs[row], np.float32)
        try:
            logits, diffs, signs = _replay(
                sign_probe,
                replay.witness,
                sample,
                out[row],
                report.tolerance,
                options,
                replay.judged,
            )
            recurrence.add(row, sample, diffs, signs)
        except _Mismatch as why:
            details = mismatch_diagnostics(report, failing, row, str(why), why.diffs)
            raise ConversionMismatchError(
                f"{report.candidate} vs {report.reference} disagree on sample {row} ({why}); "
                f"{numbers}",
                details,
            ) from None
        resolved[row] = logits.reshape(-1)
        report.tie_samples.append(row)
        report.tie_positions += sum(d.positions for d in diffs)
        report.tie_largest = max([report.tie_largest, *(d.largest for d in diffs)])
    return resolved


def mismatch_diagnostics(
    report: GateReport,
    failing: list[int],
    sample: int | None,
    why: str,
    diffs: list[SignDiff] | tuple[SignDiff, ...] = (),
) -> dict[str, Any]:
    """What a refusal shows (written next to the run by bnnexport): the plain numbers, the
    samples that failed the plain comparison, the sample refused and why, and per binarization
    of that sample (compute order) how many signs the candidate took differently and how far
    from zero; samples resolved before it are `report.tie_samples`."""
    return {
        "comparison": f"{report.candidate} vs {report.reference}",
        "samples": report.samples,
        "plain_argmax_agreement": report.plain_argmax_agreement,
        "plain_max_abs_diff": report.plain_max_abs_diff,
        "tolerance": report.tolerance,
        "failing_samples": failing,
        "resolved_samples": list(report.tie_samples),
        "refused_sample": sample,
        "why": why,
        "first_differing_binarization": diffs[0].source if diffs else None,
        "binarizations": [d.to_json() for d in diffs],
    }
