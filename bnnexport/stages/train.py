"""`train(config) -> TrainReport`: train a BNN with Bop (or the latent Adam baseline).

Writes into the run directory: `checkpoint.pt` (atomically, every epoch), `config.json`,
`metrics.jsonl` (step and epoch records: loss, accuracy, flips and π_t per binary layer),
`train.json`, and the plots `accuracy.png` and `flip_rate.png`. The options are a
`TrainConfig` (`bnnexport.training.config`), one epoch's work is the `Trainer`'s
(`bnnexport.training.loop`), what a resumed run may change is `bnnexport.training.resume`'s.

Example:
    >>> from bnnexport.training.config import TrainConfig
    >>> report = train(TrainConfig(epochs=1, out="runs/quick"))  # doctest: +SKIP
    >>> report.test_accuracy  # doctest: +SKIP
    0.93
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from bnnexport.errors import ConfigError
from bnnexport.nn.layers import (
    bf16_counts,
    set_latent,
)
from bnnexport.run import files
from bnnexport.run.directory import RunDir, clear_run, lock_run
from bnnexport.run.files import write_bytes_atomic
from bnnexport.run.provenance import remove_derived
from bnnexport.run.records import append_jsonl, read_jsonl
from bnnexport.stages.report import Report, write_json_atomic
from bnnexport.training.config import (
    DEFAULT_EPOCHS,
    TrainConfig,
    check_dataset_options,
    check_schedules,
    validate_config,
)
from bnnexport.training.distributed import DistributedContext, process_batch_size, setup
from bnnexport.training.loop import (
    EpochResult,
    Trainer,
    evaluate_counts,
    recalibrate_batchnorm,
)
from bnnexport.training.metrics import (
    NO_TENSORBOARD,
    TENSORBOARD_FILE,
    metrics_csv,
    tensorboard_available,
    training_seconds,
    write_tensorboard,
)
from bnnexport.training.resume import (
    check_run,
    file_identity,
    interrupted,
    resumed_config,
)


@dataclass
class TrainReport(Report):
    """What `bnnexport train` prints."""

    run_dir: str
    model: str
    dataset: str
    optimizer: str
    epochs: int
    train_accuracy: float
    test_accuracy: float
    train_loss: float
    seconds: float  # training time over all the run's epochs (metrics.training_seconds)
    seconds_per_epoch: float
    binary_parameters: int
    # π of the last epoch per binary layer: log(mean per-step flip fraction + e^-9)
    flip_rate: dict[str, float]
    resumed_from_epoch: int = 0
    world_size: int = 1  # processes that trained (torchrun); the effective batch is batch x this
    rank_mismatched_weights: int = 0  # binary weights differing from rank 0's; must stay 0
    strict: bool = False  # the saved checkpoint verified strictly binary (bnnexport.stages.verify)
    resume_changes: dict[str, list] = field(default_factory=dict)  # option: [old, new]
    # what --resume removed because it was made from the checkpoint training replaces
    resume_removed: list[str] = field(default_factory=list)
    precision: str = "float32"  # how the binary layers computed (--precision, auto resolved)
    bf16_fallbacks: int = 0  # bf16-exact forward calls recomputed in float32 (sums too large)
    bf16_calls: int = 0
    mean_flip_rate: float = -9.0  # the same over all binary weights together
    notes: list[str] = field(default_factory=list)  # choices made for the user (the data's size)
    wall_seconds: float = 0.0  # this call, wall clock (evaluation, checkpoints, plots included)


TRAIN_OWNED = ("config.json", "metrics.jsonl", "train.json", "accuracy.png", "flip_rate.png",
               "metrics.csv", TENSORBOARD_FILE)  # fmt: skip


def train(
    config: TrainConfig,
    resume: bool = False,
    force: bool = False,
    progress: bool | None = None,
    explicit: set[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainReport:
    """Train, checkpointing every epoch; with `resume`, continue from the run's checkpoint.

    On resume the saved configuration is used; `explicit` names the options the user gave,
    which are applied when a resumed run can take them (`resume.resumable`) and refused
    otherwise (see `resumed_config`). `force` replaces a finished run, deleting only
    bnnexport's own files, and only once the configuration, the data and the model have been
    checked. The run directory is locked for the whole run
    (`bnnexport.run.directory.lock_run`).
    `progress=None` shows progress bars only when stderr is a terminal; what the data set's
    loader chose for the user (imagefolder: the images' own size) is one `bnnexport: note:`
    line on stderr unless `progress=False`, and in the report's `notes`. `log` is called with
    one line per epoch (epoch k/N, loss, accuracies, seconds) and, unless `progress=False`, with
    a note naming what `resume` removed (always in the report's `resume_removed`); without it
    the epoch line shows only under the progress bars. Under `torchrun`, every process trains
    on its share of each batch (`batch_size` is the global batch, batch_size / N per process;
    ConfigError when N does not divide it) and only rank 0 writes files, reports and logs.
    Ctrl-C raises TrainingInterrupted, saying which checkpoint `--resume` continues from.
    """
    validate_config(config)
    context = setup(config.device)
    run = RunDir(config.out)
    found = file_identity(run.checkpoint)
    try:
        if not context.is_main:  # only rank 0 writes, so only rank 0 locks
            report = _train(config, resume, force, progress, context, explicit, log)
        else:
            with lock_run(config.out, create=True):
                report = _train(config, resume, force, progress, context, explicit, log)
        # rank 0 still writes the run directory after the last collective; a rank that tears
        # its gloo group down meanwhile was once seen to abort (SIGABRT) in CI. Only on success:
        # after an error, the other rank may be in another collective and a barrier would hang
        context.barrier()
        return report
    except KeyboardInterrupt as interrupt:
        saved_now = file_identity(run.checkpoint) != found  # a save of this call replaced it
        raise interrupted(run, resume, saved_now, config.device) from interrupt
    finally:
        context.shutdown()


def _train(
    config: TrainConfig,
    resume: bool,
    force: bool,
    progress: bool | None,
    context: DistributedContext,
    explicit: set[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainReport:
    """`train`'s work (on rank 0 inside the run directory's lock): check every input, make the
    run directory ready, train the remaining epochs, report."""
    log = log if context.is_main else None  # under torchrun only rank 0 speaks
    run = RunDir(config.out)
    checkpoint = check_run(run, resume, force)
    changes: dict[str, list] = {}
    if checkpoint is not None:
        config, changes = resumed_config(checkpoint, config, explicit, run.checkpoint)
        stored = _finished_report(run, checkpoint, config, changes)
        if stored is not None:
            return stored
        files.require_run_directory(run.root)  # what training on will rewrite is bnnexport's
    config.epochs = config.epochs or DEFAULT_EPOCHS
    process_batch_size(config.batch_size, context.world_size)  # every rank refuses alike
    # here, not in validate_config: on --resume the data set is the run's own, known only now
    check_dataset_options(config.dataset, config.dataset_options)
    # Data and model are loaded before anything in the run directory changes: a bad option
    # must leave an existing run as it was, even with --force.
    trainer = Trainer(config, run, checkpoint, context, changes)
    # every value the schedules take over the run's steps, now that the data fix their number
    check_schedules(config, trainer.steps_per_epoch * int(config.epochs))
    _print_notes(trainer, context, progress)
    context.barrier()  # every rank has checked before rank 0 changes anything
    removed: list[str] = []
    if context.is_main:
        removed = _prepare_run(run, trainer, checkpoint is not None, force, changes)
    if removed and log is not None and progress is not False:  # --json: resume_removed
        names = ", ".join(removed)
        log(f"bnnexport: note: --resume: removed {names} (made from the old checkpoint)")
    context.barrier()

    show = context.is_main and (sys.stderr.isatty() if progress is None else progress)
    started = time.perf_counter()
    result, test_acc, epoch_seconds = _run_epochs(trainer, run, context, show, log)
    if checkpoint is not None and not epoch_seconds:
        test_acc = _stored_results(run, result)  # nothing left to train: the stored state
    if config.optimizer == "adam-latent":
        set_latent(trainer.model, False)
    mismatched = context.count_mismatches(list(trainer.optimizer.binary_kernels.values()))
    report = _report(trainer, run, result, test_acc, epoch_seconds, changes)
    report.wall_seconds = time.perf_counter() - started
    report.seconds = training_seconds(read_jsonl(run.metrics)) if context.is_main else 0.0
    report.resume_removed = removed
    report.rank_mismatched_weights = mismatched
    if context.is_main:
        _save_verified(run, report)
    return report


def _print_notes(trainer: Trainer, context: DistributedContext, progress: bool | None) -> None:
    """The run's `_notes`, one `bnnexport: note:` line each on stderr (rank 0, unless
    `progress=False`)."""
    for note in _notes(trainer):
        if context.is_main and progress is not False:
            print(f"bnnexport: note: {note}", file=sys.stderr)


def _save_verified(run: RunDir, report: TrainReport) -> None:
    """Rank 0, once training ends: train.json (saying whether the saved checkpoint verified
    strictly binary) and the plots, then `NotBinaryError` for a model that did not."""
    from bnnexport.stages.plots import plot_training
    from bnnexport.stages.verify import require_strict, verify_run

    # no non-binary model leaves training silently: recorded in train.json, then raised
    verified = verify_run(run.root)
    report.strict = verified.strict
    plot_training(run)
    report.save(run.train_report)
    require_strict(verified)


def _finished_report(
    run: RunDir, checkpoint: dict, config: TrainConfig, changes: dict[str, list]
) -> TrainReport | None:
    """A run that has trained all its epochs: its stored report (nothing is rewritten)."""
    done = int(checkpoint.get("epoch", 0))
    if done < config.epochs:  # type: ignore[operator]
        return None
    if changes:
        raise ConfigError(
            f"{run.root} has finished its {done} epoch(s), so "
            f"{', '.join('--' + n.replace('_', '-') for n in changes)} would change "
            "nothing: raise --epochs to train on with them"
        )
    return _stored_report(run)


def _report(
    trainer: Trainer,
    run: RunDir,
    result: EpochResult,
    test_acc: float,
    epoch_seconds: list[float],
    changes: dict[str, list],
) -> TrainReport:
    config, context = trainer.config, trainer.context
    return TrainReport(
        run_dir=str(run.root),
        model=config.model,
        dataset=config.dataset,
        optimizer=config.optimizer,
        epochs=config.epochs,
        train_accuracy=result.accuracy,
        test_accuracy=test_acc,
        train_loss=result.loss,
        seconds=0.0,  # the caller's: every epoch's, from metrics.jsonl
        seconds_per_epoch=sum(epoch_seconds) / len(epoch_seconds) if epoch_seconds else 0.0,
        binary_parameters=trainer.kernels.parameters,
        flip_rate=result.flip_rate,
        mean_flip_rate=result.mean_flip_rate,
        resumed_from_epoch=trainer.start_epoch,
        world_size=context.world_size,
        resume_changes=changes,
        precision=trainer.precision,
        notes=_notes(trainer),
        **bf16_counts(trainer.model),
    )


def _notes(trainer: Trainer) -> list[str]:
    """Choices made for the user (the data's size, a recipe's schedules scaled to fewer
    epochs) and what this run will not write: one line each, in train.json's `notes`."""
    from bnnexport.training.recipes import compression_note

    notes = trainer.data.note.splitlines() if trainer.data.note else []
    notes += [n for n in [compression_note(trainer.config), trainer.resume_note,
                          trainer.sharing_note()] if n]  # fmt: skip
    return notes + ([] if tensorboard_available() else [NO_TENSORBOARD])


def _prepare_run(
    run: RunDir, trainer: Trainer, resuming: bool, force: bool, changes: dict[str, list]
) -> list[str]:
    """Rank 0, once every input is checked: make the run directory ready for training.
    Returns the names of the files a resumed run removed as made from its old checkpoint."""
    config = trainer.config
    removed: list[str] = []
    if not resuming:
        # --force: every file of the old run, whatever its name; else leftovers of a run
        # interrupted before its first checkpoint, whose metrics would otherwise be appended to.
        clear_run(run.root) if force else files.remove(run.root / n for n in TRAIN_OWNED)
        write_bytes_atomic(run.metrics, b"", append=True)
    else:
        if trainer.start_epoch < config.epochs:  # the checkpoint will change: what was made
            removed = remove_derived(run.root, "checkpoint.pt")  # from it would be stale
        # Work after the last checkpoint is redone: drop its metrics so curves do not double.
        kept = [r for r in read_jsonl(run.metrics) if r.get("step", 0) <= trainer.step]
        if changes:
            kept.append({"kind": "resume", "step": trainer.step,
                         "epoch": trainer.start_epoch, "changed": changes})  # fmt: skip
        payload = "".join(_json_line(r) for r in kept).encode()
        write_bytes_atomic(run.metrics, payload, append=True)
    # the options, how many processes shared each batch, the record of binary kernels they
    # led to, the classes' names and the model's source (the checkpoint holds them too)
    recorded = {"class_names": trainer.data.class_names, "model_source": trainer.model_source}
    write_json_atomic(run.config, {**config.to_json(), **trainer.data_parallel(),
                                   "binary_kernels": trainer.kernels.to_json(),
                                   **recorded})  # fmt: skip
    return removed


def _run_epochs(
    trainer: Trainer,
    run: RunDir,
    context: DistributedContext,
    show: bool,
    log: Callable[[str], None] | None = None,
) -> tuple[EpochResult, float, list[float]]:
    """Train the remaining epochs: (last epoch's result, test accuracy, seconds per epoch).
    Each epoch ends with one line to `log` (rank 0), else under the progress bars (`show`)."""
    config = trainer.config
    epoch_seconds: list[float] = []
    result = EpochResult(float("nan"), float("nan"), {}, trainer.step)
    test_acc = float("nan")
    for epoch in range(trainer.start_epoch, config.epochs):
        epoch_start = time.perf_counter()
        result = trainer.train_epoch(epoch, show)
        epoch_seconds.append(time.perf_counter() - epoch_start)
        if config.recalibration_batches:
            # Every rank does it on its share of the same global batches: with sync_batchnorm
            # the statistics are the global ones everywhere (else DDP broadcasts rank 0's).
            batches = itertools.islice(trainer.loader(epoch), config.recalibration_batches)
            recalibrate_batchnorm(trainer.model, batches, device=context.device)
        if context.is_main:
            test = evaluate_counts(trainer.model, trainer.data.test, device=context.device)
            test_acc = test.top1
            append_jsonl(
                run.metrics,
                [
                    {
                        "kind": "epoch",
                        "step": trainer.step,
                        "epoch": epoch + 1,
                        "train_loss": result.loss,
                        "train_accuracy": result.accuracy,
                        "train_top5_accuracy": result.top5_accuracy,
                        "test_accuracy": test_acc,
                        "test_top5_accuracy": test.top5,
                        "seconds": epoch_seconds[-1],
                        "flip_rate": result.flip_rate,
                        "mean_flip_rate": result.mean_flip_rate,
                    }
                ],
            )
            trainer.save(epoch + 1)
            files.record(run.metrics, append=True)  # what this epoch appended is ours too
            _export_metrics(run, config)
        context.barrier()
        line = (
            f"epoch {epoch + 1}/{config.epochs}: loss {result.loss:.4f} "
            f"train {result.accuracy:.4f} test {test_acc:.4f} ({epoch_seconds[-1]:.1f} s)"
        )
        if log is not None:  # a terminal, a CI log, `| tee`: one plain line each
            log(line)
        elif show:
            tqdm.write(line, file=sys.stderr)
    return result, test_acc, epoch_seconds


def _export_metrics(run: RunDir, config: TrainConfig) -> None:
    """metrics.csv (with `metrics_csv`) and TensorBoard scalars (unless the tensorboard
    package is missing, which train has said), each rewritten whole from metrics.jsonl."""
    records = read_jsonl(run.metrics)
    if config.metrics_csv:
        write_bytes_atomic(run.root / "metrics.csv", metrics_csv(records))
    write_tensorboard(run.root, records)


def _stored_results(run: RunDir, result: EpochResult) -> float:
    """A resumed run with nothing left to train: its last recorded loss, accuracies and flip
    rates (into `result`); returns the stored test accuracy."""
    records = read_jsonl(run.metrics)
    test_acc = float("nan")
    last = [r for r in records if r.get("kind") == "epoch"]
    if last:
        result.loss, result.accuracy = last[-1]["train_loss"], last[-1]["train_accuracy"]
        test_acc = last[-1]["test_accuracy"]
    steps = [r for r in records if r.get("kind") == "step"]
    if last and "flip_rate" in last[-1]:
        result.flip_rate = last[-1]["flip_rate"]
        result.mean_flip_rate = last[-1]["mean_flip_rate"]
    elif steps:  # runs from before epoch rows held π: never record emptied flip rates
        result.flip_rate = steps[-1].get("flip_rate", {})
    return test_acc


def _stored_report(run: RunDir) -> TrainReport | None:
    """The train.json of a finished run, or None when it is missing or from another version."""
    try:
        return TrainReport(**json.loads(run.train_report.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _json_line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"
