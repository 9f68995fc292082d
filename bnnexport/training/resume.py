"""The resume rules: what a resumed run keeps, what it may change, and what Ctrl-C says.

A resumed run takes its own configuration from the checkpoint; the options given on the command
line that a resumed run may change (`resumable`) are applied and recorded, any other one that
differs is refused naming it. An interrupted run's one line names its last checkpoint and the
command that continues it.

Example:
    >>> resumable("lr"), resumable("sigma"), resumable("model")
    (True, True, False)
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from bnnexport.datasets import recorded_options
from bnnexport.errors import CheckpointError, ConfigError, TrainingInterrupted
from bnnexport.optim.composite import CaseOptimizer, all_hyperparameters
from bnnexport.run import files
from bnnexport.run.checkpoint import load_checkpoint
from bnnexport.run.directory import RunDir
from bnnexport.training.config import TrainConfig, config_keys

# What a resumed run may change besides its optimizer's schedules (`resumable`; recorded in
# config.json and metrics.jsonl); every other option that differs from the run's own is
# refused by name rather than silently ignored.
RESUMABLE = ("batch_size", "epochs", "data_dir", "device", "precision", "num_workers",
             "log_every", "eval_every", "metrics_csv")  # fmt: skip


def resumable(name: str) -> bool:
    """Whether a resumed run may change option `name`: one of RESUMABLE, or a registered
    optimizer's hyperparameter that takes a schedule (`apply_schedules` sets it anew after
    the optimizer's state is loaded; one that takes a number only stays in that state)."""
    hyperparameter = all_hyperparameters().get(name)
    return name in RESUMABLE or (hyperparameter is not None and hyperparameter.schedulable)


def check_run(run: RunDir, resume: bool, force: bool) -> dict | None:
    """The checkpoint to resume from, or None; refuses before anything is changed."""
    if resume:
        if not run.checkpoint.is_file() and run.config.is_file():  # stopped before epoch 1 ended
            raise CheckpointError(
                f"nothing to resume: {run.root} holds no checkpoint (the run stopped before its "
                "first epoch ended); run the same command without --resume to start it afresh"
            )
        if not run.checkpoint.is_file():
            raise CheckpointError(f"nothing to resume: {run.checkpoint} does not exist")
        return load_checkpoint(run.checkpoint)  # its folder: checked by train, once known
    files.require_run_directory(run.root)  # with or without --force: the user's files stay
    if run.checkpoint.is_file() and not force:
        raise CheckpointError(
            f"{run.root} already holds a trained run: use --resume to continue it, "
            "--force to start over, or another --out"
        )
    return None


def resumed_config(
    checkpoint: dict, config: TrainConfig, explicit: set[str] | None, source: Path
) -> tuple[TrainConfig, dict[str, list]]:
    """The run's own configuration with the options given explicitly applied, and the changes.

    Options that are `resumable` are applied (and returned as {name: [old, new]}); a different
    model, data set, optimizer or seed is refused naming the option. `explicit=None` (library
    callers) applies only `epochs` and `device`.
    """
    saved_json = checkpoint.get("config")
    if not isinstance(saved_json, dict) or saved_json.get("initialised_only"):
        raise CheckpointError(
            f"{source} was written by `bnnexport init` (an untrained model), not by train: "
            "there is nothing to resume; train a new run with another --out or --force"
        )
    saved_json = dict(saved_json)
    if "amp" in saved_json:  # runs from before --precision: --amp was the only other mode
        saved_json.setdefault("precision", "amp" if saved_json.pop("amp") else "float32")
    # runs from before the option computed BatchNorm statistics per process under torchrun
    saved_json.setdefault("sync_batchnorm", False)
    unknown = sorted(set(saved_json) - set(config_keys()))
    if unknown:
        raise ConfigError(
            f"{source}: unknown configuration key(s) {', '.join(unknown)}: written by another "
            "version of bnnexport"
        )
    saved = TrainConfig.from_json(saved_json)
    if not checkpoint.get("global_batch"):  # batch_size was each process's then
        saved.batch_size *= _trained_world_size(source.parent)
    saved.dataset_options = recorded_options(saved.dataset, saved.dataset_options)
    done = int(checkpoint.get("epoch", 0))
    saved.out = config.out  # the run may have been moved or copied since
    names = {"epochs", "device"} if explicit is None else set(explicit) - {"out"} | {"device"}
    changes: dict[str, list] = {}
    for name in sorted(names):
        new, old = config.value(name), saved.value(name)
        if name == "dataset_options":  # each option given is checked against the run's own
            new = {**old, **new}
        if new is None or new == old:
            continue
        if not resumable(name):
            option, new, old = _differing(name, new, old)
            raise ConfigError(
                f"--{option.replace('_', '-')} {new} differs from the run's {old}: a resumed run "
                f"keeps its {option}; drop the option, or start over with --force or another --out"
            )
        if name == "epochs" and new < done:
            raise ConfigError(
                f"--epochs {new} is below the {done} epoch(s) this run has already trained"
            )
        if name != "device":  # where to train is not part of the run's record
            changes[name] = [old, new]
        saved.set_value(name, new)
    return saved, changes


def _trained_world_size(run_dir: Path) -> int:
    """How many processes trained a run from before `--batch-size` was the global batch, as
    its train.json says (1 without one: a run interrupted before its first train.json is
    taken for a one-process run)."""
    try:
        return max(1, int(json.loads((run_dir / "train.json").read_text()).get("world_size", 1)))
    except (OSError, ValueError, TypeError, AttributeError):
        return 1


def _differing(name: str, new: Any, old: Any) -> tuple[str, Any, Any]:
    """The option that differs, with its new and old values: a data set option by its name."""
    if name == "dataset_options":
        key = next(k for k in sorted(new) if new[k] != old.get(k))
        return key, new[key], old.get(key)
    return name, new, old


def apply_schedules(optimizer: CaseOptimizer, config: TrainConfig, changes: dict) -> None:
    """Loading the optimizer state restored the old schedules: put the changed ones back."""
    for key in all_hyperparameters():
        if key in changes:
            optimizer.set_schedule(key, config.value(key))


def file_identity(path: Path) -> tuple[int, int] | None:
    """(inode, modification time) of a file, None when there is none: every checkpoint save
    renames a new file into place, so a saved checkpoint never has the identity of the old."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def interrupted(run: RunDir, resume: bool, saved_now: bool, device: str) -> TrainingInterrupted:
    """What a user who stopped training needs: which epoch the run's last checkpoint holds and
    the command that continues from it, or that no checkpoint of this run was saved."""
    epoch, epochs = _saved_epochs(run.checkpoint) if resume or saved_now else (0, 0)
    if epoch < 1:  # an `init` checkpoint (epoch 0) holds no training either
        return TrainingInterrupted(
            f"interrupted before the first checkpoint: no epoch of this run was saved in "
            f"{run.root}; run the same command again to start afresh (it replaces what this run "
            "wrote there)"
        )
    if not saved_now:  # a resumed run: the options it was given are not in the checkpoint yet
        return TrainingInterrupted(
            f"interrupted before the next checkpoint: the last one (epoch {epoch}) is in "
            f"{run.root}; continue with the same command"
        )
    command = f"bnnexport train --out {shlex.quote(str(run.root))} --resume"
    if device != "cpu":  # --resume trains on the CPU unless told otherwise
        command += f" --torch-device {shlex.quote(device)}"
    return TrainingInterrupted(
        f"interrupted: the last checkpoint (epoch {epoch} of {epochs}) is in {run.root}; "
        f"continue with {command}"
    )


def _saved_epochs(path: Path) -> tuple[int, int]:
    """(epochs trained, epochs planned) of the checkpoint at `path`; (0, 0) without one."""
    try:
        checkpoint = load_checkpoint(path)
        return int(checkpoint["epoch"]), int(checkpoint["config"]["epochs"])
    except (CheckpointError, KeyError, TypeError, ValueError):
        return 0, 0
