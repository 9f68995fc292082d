"""The whole chain in one call: train -> verify -> pack -> export -> convert -> bench.

Each stage is the same library function its own command calls; the run directory is the
hand-off between them, so a pipeline run leaves exactly what running the commands one by one
would. The first stage that fails stops the chain with its own one-line error.

Example:
    >>> from bnnexport.stages.pipeline import pipeline
    >>> from bnnexport.training.config import TrainConfig
    >>> report = pipeline(TrainConfig(epochs=5, out="runs/demo"))       # doctest: +SKIP
    >>> print(report.bench.to_table())                                  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from bnnexport.run.directory import lock_run
from bnnexport.stages.bench.device import copy_batch, needs_batched_copy, reach_device
from bnnexport.stages.bench.measure import BenchReport, bench
from bnnexport.stages.bench.options import BenchOptions, DeviceTarget
from bnnexport.stages.report import Report
from bnnexport.stages.train import train
from bnnexport.training.config import TrainConfig


@dataclasses.dataclass
class PipelineReport(Report):
    """Every stage's report, and the bench results with the path of report.md."""

    run_dir: str
    stages: dict[str, dict[str, Any]]
    seconds: dict[str, float]
    bench: BenchReport
    report_md: str | None

    def to_table(self) -> str:
        """One line per stage, then the bench table (ending with the report's path)."""
        lines = [f"run directory: {self.run_dir}"]
        for name, seconds in self.seconds.items():
            lines.append(f"  {name:<8} done in {seconds:7.1f} s{_highlight(name, self.stages)}")
        return "\n".join(lines + ["", self.bench.to_table()])


def _highlight(name: str, stages: dict[str, dict[str, Any]]) -> str:
    """A few telling numbers of a stage's report, for the summary line."""
    keys = {
        "train": ("test_accuracy",),
        "verify": ("strict", "binary_parameters"),
        "pack": ("packed_bytes", "file_ratio", "binary_kernel_ratio"),
        "export": ("onnx_accuracy", "argmax_agreement"),
        "convert": ("lce_bconv2d", "argmax_agreement", "lce_bytes"),
    }.get(name, ())
    data = stages.get(name, {})
    parts = [
        f"{k}={data[k]:.4g}" if isinstance(data[k], float) else f"{k}={data[k]}"
        for k in keys
        if k in data
    ]
    return f"  ({', '.join(parts)})" if parts else ""


def pipeline(
    config: TrainConfig,
    options: BenchOptions = BenchOptions(),
    resume: bool = False,
    force: bool = False,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
    device: DeviceTarget | None = None,
    explicit: set[str] | None = None,
) -> PipelineReport:
    """Run every stage on `config.out`; return their reports.

    Args:
        config: the training configuration (`config.out` is the run directory).
        options: as for `bench` (`BenchOptions`); `options.target` is also the LCE flatbuffer's
            target (the float TFLite model is always written too, so bench can compare all four
            backends), and `options.samples` how many test samples export writes (None: 1000).
        resume, force, progress, explicit: as for `train` (`explicit`: the options given, which
            a resumed run applies where it can).
        log: called with one line as each stage starts (e.g. `click.echo` to stderr), and
            with train's line per epoch and notes (`train`'s `log`).
        device: as for `bench`, to include a device. With a device, convert also writes the
            batched copy (batch N) bench needs for accuracy there (N = min(device.batch, samples)).
    """
    from bnnexport.stages.convert import convert_run
    from bnnexport.stages.export import export_onnx
    from bnnexport.stages.pack import pack
    from bnnexport.stages.verify import require_strict, verify_run

    run_dir = config.out
    samples = 1000 if options.samples is None else options.samples  # export writes this many
    chain = _Chain(str(run_dir), log or (lambda line: None))
    if device is not None:  # an unreachable device fails now, not after training
        reach_device(device)
    with lock_run(run_dir, create=True):  # one writer for the whole chain
        chain.stage(
            "train",
            lambda: train(
                config, resume=resume, force=force, progress=progress, explicit=explicit, log=log
            ),
        )
        # a model that is not strictly binary stops here (exit 1), before anything is exported
        chain.stage("verify", lambda: require_strict(verify_run(run_dir)))
        chain.stage("pack", lambda: pack(run_dir))
        chain.stage("export", lambda: export_onnx(run_dir, samples=samples))
        copy = None
        if device is not None and needs_batched_copy(device):
            copy = copy_batch(samples, device.batch)
        target = options.target
        # a run trained with int8 float layers converts to its int8 flatbuffer alone
        fmt = "lce" if config.float_layers == "int8" else "tflite"
        chain.stage(
            "convert", lambda: convert_run(run_dir, target=target, fmt=fmt, batched_copy=copy)
        )
        result = chain.stage("bench", lambda: bench(run_dir, options, device=device))
    return chain.report(result)


class _Chain:
    """The stages of one pipeline run so far: each one's report and seconds, its line said as
    it starts."""

    def __init__(self, run_dir: str, say: Callable[[str], None]) -> None:
        self.run_dir = run_dir
        self.say = say
        self.stages: dict[str, dict[str, Any]] = {}
        self.seconds: dict[str, float] = {}

    def stage(self, name: str, call: Callable[[], Report]) -> Any:
        """Run the stage `name` (`call`), recording its report and seconds; returns its report."""
        self.say(f"[{len(self.seconds) + 1}/{len(STAGES)}] {name} {self.run_dir}")
        start = time.perf_counter()
        report = call()
        self.seconds[name] = time.perf_counter() - start
        self.stages[name] = report.to_json()
        return report

    def report(self, bench: BenchReport) -> PipelineReport:
        """Every stage's report, with `bench`'s results and the path of its report.md."""
        return PipelineReport(
            run_dir=self.run_dir,
            stages=self.stages,
            seconds=self.seconds,
            bench=bench,
            report_md=bench.report_md,
        )


STAGES = ("train", "verify", "pack", "export", "convert", "bench")
