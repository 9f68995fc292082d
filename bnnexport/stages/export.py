"""`bnnexport export`: the trained model -> RUN_DIR/model.onnx, checked in ONNX Runtime.

The model is exported with the legacy TorchScript exporter (`dynamo=False`), so every
binarization is written as `Sign -> Add -> Sign` (docs/LCE_NOTES.md "PyTorch to ONNX"). Constant
folding is off: it would fold BatchNorm into the binary kernels (±1 times a scale), and the rounding
of those scaled sums turns a binary conv's exact zeros into tiny signed values, so ONNX Runtime
would no longer agree with PyTorch's sign(0) = +1. Kept separate, kernels stay exactly ±1 and the
ONNX model computes exactly what PyTorch does; the converter folds BatchNorm itself.

model.onnx is written through a temporary file and replaced only when ONNX Runtime agrees with
PyTorch (`converters.gate`), so a failed export leaves any previous model.onnx untouched; the
test samples every later fidelity check uses go to RUN_DIR/samples.npz with it. With `out`, the
ONNX model goes there instead and the run directory is left as it is. A
sample where the two part only at float-rounding ties of binarization inputs (deep models with
real-valued paths meet some at 224x224) passes when PyTorch, run with ONNX Runtime's signs
imposed at every binarization (`bnnexport.stages.torch_probe`), reproduces ONNX Runtime's outputs
and every sign that had to change was a bounded, non-zero near-tie; `tie_samples` lists them, and
the report gives the plain numbers (`argmax_agreement`, `max_abs_diff`) beside the resolved.

Example:
    >>> from bnnexport.stages.export import export_onnx
    >>> report = export_onnx("runs/demo")                        # doctest: +SKIP
    >>> report.argmax_agreement, report.binary_layers            # doctest: +SKIP
    (1.0, 3)
"""

from __future__ import annotations

import io
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bnnexport.converters.gate import RTOL
from bnnexport.converters.runtimes import fd_filtered
from bnnexport.errors import ConfigError, DataError, ExporterError
from bnnexport.nn.int8 import for_export
from bnnexport.run import files, provenance
from bnnexport.run.checkpoint import open_run_model
from bnnexport.run.directory import RunDir
from bnnexport.run.files import write_bytes_atomic
from bnnexport.stages.progress import Steps
from bnnexport.stages.report import Report

if TYPE_CHECKING:
    from bnnexport.converters.gate import GateReport


@dataclass
class ExportReport(Report):
    """What `bnnexport export` prints and writes to RUN_DIR/export.json."""

    onnx: str
    opset: int
    batch: int
    samples: int
    binary_layers: int  # in the exported graph (`converters.patterns`)
    binary_parameters: int  # of the run's record of binary kernels
    argmax_agreement: float  # plain: before any sign-tie replay
    max_abs_diff: float
    tolerance: float
    resolved_argmax_agreement: float
    resolved_max_abs_diff: float
    tie_samples: list[int]
    tie_positions: int
    tie_largest: float
    torch_accuracy: float
    onnx_accuracy: float
    onnx_bytes: int
    seconds: float


def _check_binary(run: RunDir) -> None:
    """The verify stage: no kernel that is not strictly ±1 leaves the pipeline (exit 1)."""
    from bnnexport.stages.verify import require_strict, verify_run

    require_strict(verify_run(run.root))


def _save_samples(
    run: RunDir, inputs: np.ndarray, labels: np.ndarray, names: list[str] | None
) -> None:
    buffer = io.BytesIO()
    named = {"class_names": np.array(names, dtype=str)} if names else {}
    np.savez(buffer, inputs=inputs, labels=labels, **named)
    write_bytes_atomic(run.samples, buffer.getvalue())


def run_test_samples(
    checkpoint: dict, samples: int
) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    """The first `samples` test images (NCHW float32) and labels of the run's data set, and
    its class names (None: unnamed); DataError when the data set's classes are no longer the
    ones the run trained on (a class folder added, removed or renamed since).

    A run without a data set (`bnnexport init` without --dataset) gets seeded random inputs of
    the model's shape instead, on a 1/64 grid in [-1, 1] (so float sums are exact in every
    runtime and no pre-activation sits a rounding error away from a sign change), with label -1:
    agreement between backends is checked, accuracy means nothing there.
    """
    from bnnexport.datasets import load_dataset, recorded_options

    config = checkpoint.get("config") or {}
    names = checkpoint.get("class_names")
    if "dataset" not in config:
        shape = [int(v) for v in checkpoint["model_kwargs"]["input_shape"]]
        grid = np.random.default_rng(0).integers(-64, 65, size=(samples, *shape))
        inputs = (grid / 64.0).astype(np.float32)
        labels = np.full(samples, -1, dtype=np.int64)
    else:
        data = load_dataset(
            config["dataset"],
            config.get("data_dir"),
            augment=False,
            **recorded_options(config["dataset"], config.get("dataset_options", {})),
        )
        if names and data.class_names and list(names) != list(data.class_names):
            raise DataError(
                f"{config['dataset']} now has the classes {data.class_names}, the run trained "
                f"on {list(names)}: its labels are not the model's outputs"
            )
        count = min(samples, len(data.test))
        pairs = [data.test[k] for k in range(count)]
        inputs = torch.stack([x for x, _ in pairs]).numpy().astype(np.float32)
        labels = np.asarray([int(y) for _, y in pairs], dtype=np.int64)
        names = names or data.class_names  # a run from before names were recorded
    return inputs, labels, names


def onnx_export(model: torch.nn.Module, example: torch.Tensor, path: Path, **options: Any) -> None:
    """`torch.onnx.export(model, (example,), path, **options)` (legacy exporter unless
    `dynamo=True`), its warnings and its own printing silenced (on a failure the legacy
    exporter prints the whole TorchScript graph on stdout, where `--json` wants one object);
    ExporterError, one line, naming what it refused."""
    options.setdefault("dynamo", False)
    try:
        with warnings.catch_warnings(), fd_filtered(1, lambda _line: True), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (example,), str(path), **options)
    except Exception as error:  # the exporters raise many types; each becomes one line
        exporter = "dynamo" if options["dynamo"] else "legacy"
        raise ExporterError(
            f"torch.onnx.export ({exporter}) cannot export {type(model).__name__}: "
            f"{_first_sentence(error)} (train, summary, verify and pack work without the "
            "exporter; export and convert need it)"
        ) from None


def _first_sentence(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    for end in (". Please", " [Caused by", ". "):
        text = text.split(end)[0]
    return text.rstrip(".")


def torch_outputs(model: torch.nn.Module, inputs: np.ndarray, batch: int = 250) -> np.ndarray:
    """The model's outputs on NCHW inputs, in eval mode without gradients."""
    outs = []
    with torch.no_grad():
        for start in range(0, len(inputs), batch):
            outs.append(model(torch.from_numpy(inputs[start : start + batch])).numpy())
    return np.concatenate(outs)


def onnx_gate(
    model: torch.nn.Module, path: Path, inputs: np.ndarray, reference: np.ndarray
) -> tuple[np.ndarray, GateReport]:
    """ONNX Runtime's outputs on `inputs` and the gate's verdict against PyTorch's
    (`reference`); ConversionMismatchError when they disagree beyond sign ties.

    A model of your own runs in ONNX Runtime as the normaliser writes it (every sign idiom in
    the one canonical form whose signs the probe imposes; `convert` compares the flatbuffer
    with the file itself) and PyTorch replays through its traced binarizations
    (`bnnexport.stages.torch_probe.TracedProbe`). Where those cannot be matched with the graph's,
    no replay is possible and predictions alone are judged, at most one differing
    (`GateOptions.unprobed_flips`); a refusal then says why."""
    from bnnexport.converters.errors import ConversionMismatchError
    from bnnexport.converters.gate import GateOptions, OnnxProbe, Replay, validate
    from bnnexport.converters.gate.predicate import UNPROBED_FLIPS
    from bnnexport.converters.gate.quantized import CachedWitness, activation_points
    from bnnexport.converters.graph import load_onnx
    from bnnexport.converters.normalize import normalized_or_as_is
    from bnnexport.stages import torch_probe as probes

    own = not probes.has_quantizers(model)
    # a model of your own: as the normaliser writes it (its sign idioms canonical)
    graph = normalized_or_as_is(load_onnx(path)) if own else load_onnx(path)
    # ONNX Runtime's outputs come from the probe session that also witnesses its signs: the
    # probe's extra outputs change ORT's fusions, hence its rounding, so a plain session could
    # land on the other side of a tie than its own witness (QuickNet-Small at 224 did).
    # A model trained with int8 float layers: the witness also gives its int8 activations, which
    # the replay imposes in PyTorch (`bnnexport.stages.torch_probe`)
    int8 = list(activation_points(graph)) if probes.activation_quantizers(model) else []
    probe = OnnxProbe(graph, int8)
    witness = CachedWitness(probe.witness())
    candidate = np.stack([witness.run(x)[0] for x in np.asarray(inputs, np.float32)])

    # the candidate is a reference runtime on the unmodified export: a value PyTorch and ONNX
    # Runtime split on, however often it recurs, is a split between references
    imposer = witness.run if int8 else None
    try:
        probe_of = _torch_probe(model, path if not own else graph, inputs[0], imposer, own)
    except probes.UntraceableModel as why:
        options = GateOptions(rtol=RTOL, unprobed_flips=UNPROBED_FLIPS)
        try:
            return candidate, validate(reference, candidate, inputs, options, _NAMES)
        except ConversionMismatchError as error:
            raise ConversionMismatchError(
                f"{error} (PyTorch's signs cannot be replayed: {why})",
                {**error.diagnostics, "unprobed": str(why)},
            ) from None
    replay = Replay(probe_of, witness.as_witness(), judged=frozenset())
    return candidate, validate(reference, candidate, inputs, GateOptions(rtol=RTOL), _NAMES, replay)


_NAMES = ("PyTorch", "ONNX Runtime")


def _torch_probe(
    model: torch.nn.Module, graph: Any, sample: np.ndarray, imposer: Any, own: bool
) -> Any:
    """A builder of PyTorch's sign probe: bnnexport's `Quantizer` hooks, built when a sample
    needs a replay; a model of your own's traced binarizations, built now (UntraceableModel when
    they cannot be matched with `graph`'s)."""
    from bnnexport.stages import torch_probe as probes

    if not own:
        return lambda: probes.TorchProbe(model, graph, imposer)
    built = probes.TracedProbe(model, graph, sample, imposer)
    return lambda: built


def check_onnx(
    model: torch.nn.Module,
    path: Path,
    inputs: np.ndarray,
    reference: np.ndarray,
    refusal: Path | None = None,
) -> tuple[np.ndarray, GateReport]:
    """`onnx_gate`, with a refusal as FidelityError (exit 1): one line naming `refusal`
    (default: gate-refusal.json beside `path`), where its diagnostics go; an inconclusive check
    (a degenerate model) says so."""
    from bnnexport.converters.errors import ConversionMismatchError
    from bnnexport.run.refusals import REFUSAL_FILE, explain_refusal, gate_refusal

    try:
        return onnx_gate(model, path, inputs, reference)
    except ConversionMismatchError as error:
        error = explain_refusal(error, path, inputs, escape="")  # export has no --trust-twin
        refusal = refusal or path.parent / REFUSAL_FILE
        raise gate_refusal(error, refusal, "the exported model is not kept") from None


def export_onnx(
    run_dir: str | Path,
    opset: int = 17,
    batch: int = 1,
    samples: int = 1000,
    progress: bool | None = None,
    out: str | Path | None = None,
) -> ExportReport:
    """Export a run's model to RUN_DIR/model.onnx (or `out`) and check it in ONNX Runtime.

    Args:
        run_dir: the run directory (with checkpoint.pt).
        opset: ONNX opset, 13-18 (what the legacy exporter honours).
        batch: the batch dimension written into the model (LCE runs batch 1).
        samples: how many test samples to write to samples.npz and check on.
        progress: step lines on stderr (None: only when stderr is a terminal).
        out: an .onnx path to write instead of RUN_DIR/model.onnx (None: the run's). The run
            directory then stays as it is (model.onnx, samples.npz, export.json), so
            `convert RUN_DIR` still converts its own model.onnx; OUT's folder gets OUT, its
            manifest provenance.json and, on a refusal, OUT-STEM-gate-refusal.json.

    Raises:
        CheckpointError / DataError / ConfigError / ForeignFileError (exit 2), NotBinaryError
        or FidelityError (exit 1).
    """
    if not 13 <= opset <= 18:
        raise ValueError(f"opset must be between 13 and 18, got {opset}")
    if batch < 1 or samples < 1:
        raise ValueError("batch and samples must be at least 1")
    start = time.perf_counter()
    steps = Steps("export", progress)
    run = RunDir(run_dir).require()
    destination, refusal = _destination(run, out)
    loaded = open_run_model(run.root)
    # a model trained with int8 float layers: its kernels as constants on their int8 grid
    checkpoint, model = loaded.checkpoint, for_export(loaded.model)
    _check_binary(run)
    inputs, labels, names = run_test_samples(checkpoint, samples)
    exported = _export_checked(model, inputs, opset, batch, refusal, steps)
    if destination == run.onnx:
        provenance.remove_derived(run.root, "model.onnx")  # flatbuffers of the old model.onnx
        _save_samples(run, inputs, labels, names)  # only now: a refused model leaves none
        write_bytes_atomic(run.onnx, exported.payload)
        provenance.record(run.root, "model.onnx", ["checkpoint.pt"])
        provenance.record(run.root, "samples.npz", ["checkpoint.pt"])
    else:
        write_bytes_atomic(destination, exported.payload)
    report = ExportReport(
        onnx=str(destination), opset=opset, batch=batch, samples=len(inputs),
        binary_layers=exported.binary_layers, binary_parameters=loaded.kernels.parameters,
        **_gate_numbers(exported.gate), **exported.accuracies(labels),
        onnx_bytes=len(exported.payload), seconds=time.perf_counter() - start,
    )  # fmt: skip
    if destination == run.onnx:
        report.save(run.root / "export.json")
    return report


@dataclass(frozen=True)
class _Exported:
    """A model exported to ONNX and passed by the gate: the file's bytes, what it holds, and
    both runtimes' outputs on the samples."""

    payload: bytes  # the ONNX file
    binary_layers: int  # in the exported graph (`converters.patterns`)
    reference: np.ndarray  # PyTorch's outputs
    candidate: np.ndarray  # ONNX Runtime's
    gate: GateReport

    def accuracies(self, labels: np.ndarray) -> dict[str, float]:
        """The report's top-1 accuracies of PyTorch and ONNX Runtime on `labels`."""
        return {
            "torch_accuracy": float(np.mean(self.reference.argmax(axis=1) == labels)),
            "onnx_accuracy": float(np.mean(self.candidate.argmax(axis=1) == labels)),
        }


def _export_checked(
    model: torch.nn.Module,
    inputs: np.ndarray,
    opset: int,
    batch: int,
    refusal: Path,
    steps: Steps,
) -> _Exported:
    """`model` exported at `opset` and `batch` to a temporary file and checked in ONNX Runtime
    against PyTorch on `inputs` (`check_onnx`: a refusal is FidelityError, its diagnostics at
    `refusal`); nothing is written where the model goes."""
    import onnx

    from bnnexport.converters.patterns import find_binary_layers

    with tempfile.TemporaryDirectory(prefix="bnnexport-export-") as tmp:
        path = Path(tmp) / "model.onnx"
        steps(f"torch.onnx.export (opset {opset}, batch {batch})")
        dummy = torch.from_numpy(np.repeat(inputs[:1], batch, axis=0))
        onnx_export(
            model, dummy, path, opset_version=opset, do_constant_folding=False,
            input_names=["input"], output_names=["logits"],
        )  # fmt: skip
        steps(f"check in ONNX Runtime against PyTorch on {len(inputs)} samples")
        reference = torch_outputs(model, inputs)
        candidate, gate = check_onnx(model, path, inputs, reference, refusal)
        binary = len(find_binary_layers(onnx.load(str(path))))
        return _Exported(path.read_bytes(), binary, reference, candidate, gate)


def _gate_numbers(gate: GateReport) -> dict[str, Any]:
    """The report's numbers of the gate: plain (before any sign-tie replay) and resolved."""
    return {
        "argmax_agreement": gate.plain_argmax_agreement,
        "max_abs_diff": gate.plain_max_abs_diff,
        "tolerance": gate.tolerance,
        "resolved_argmax_agreement": gate.argmax_agreement,
        "resolved_max_abs_diff": gate.max_abs_diff,
        "tie_samples": gate.tie_samples,
        "tie_positions": gate.tie_positions,
        "tie_largest": gate.tie_largest,
    }


def _destination(run: RunDir, out: str | Path | None) -> tuple[Path, Path]:
    """(where the ONNX model goes, where a refusal's diagnostics go), checked before any work:
    `out` must name an .onnx file bnnexport may write (`files.require_replaceable`)."""
    from bnnexport.run.refusals import REFUSAL_FILE, refusal_path

    if out is None or Path(out).resolve() == run.onnx.resolve():
        return run.onnx, run.root / REFUSAL_FILE
    out = Path(out)
    if out.suffix != ".onnx" or out.name == ".onnx":
        raise ConfigError(f"--out {out}: name an .onnx file (e.g. net.onnx)")
    refusal = refusal_path(out, None)
    for path in (out, refusal):
        files.require_replaceable(path)
    return out, refusal
