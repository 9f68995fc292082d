"""Errors a user can cause, one type per kind.

Each carries the exit code the CLI uses: 1 when a check on the model failed (it is not binary, the
converted model disagrees with the reference), 2 when the input or the environment is wrong (a
missing file, an unsupported op, an unreachable device).

`converters.errors` and `deploy.errors` define their own types (those packages never import
bnnexport); the CLI treats every exception that carries an integer `exit_code` the same way.
One kind both raise is defined once, below them: `InputShapeError` (inputs of a shape the model
does not take) is `converters.errors.InputShapeError`, handed on here.

Example:
    >>> from bnnexport.errors import DataError
    >>> DataError("no such directory: /data/cifar").exit_code
    2
"""

from __future__ import annotations

from bnnexport.converters.errors import InputShapeError as InputShapeError  # handed on (module doc)


class BnnExportError(Exception):
    """Base class: a problem to report as one line, never as a traceback."""

    exit_code = 2


class CheckFailedError(BnnExportError):
    """A check on the model itself did not pass (exit code 1)."""

    exit_code = 1


class NotBinaryError(CheckFailedError):
    """A kernel that should be strictly ±1 is not."""


class FidelityError(CheckFailedError):
    """An exported or converted model disagrees with its reference beyond the tolerance."""


class DataError(BnnExportError):
    """A data set is missing, malformed or of the wrong shape."""


class ExporterError(BnnExportError):
    """torch.onnx.export cannot export the model (an op or a shape it does not support)."""


class CheckpointError(BnnExportError):
    """A checkpoint, packed file or run directory is missing, truncated, foreign or unsafe."""


class DependencyError(BnnExportError):
    """An optional dependency (TensorFlow, LCE, ONNX Runtime) is missing or broken."""


class ConfigError(BnnExportError):
    """An option or configuration value is out of range, inconsistent or from another version."""


class ModelCodeError(ConfigError):
    """The model's own code raised while it ran (its forward), where no input could be to blame:
    named with its type, message and the model's file and line."""


class NoBinaryKernelError(ConfigError):
    """A model in which no binary kernel was found (or named)."""


class RunLockedError(BnnExportError):
    """Another bnnexport command is writing the same run directory."""


class ForeignFileError(BnnExportError):
    """A command would replace or delete a file bnnexport did not write (or that was edited
    since), or write into a folder of the user's own files (`bnnexport.run.files`)."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training, saying what was saved and how to go on (the CLI prints it as
    its one line, exit code 130). A KeyboardInterrupt, so whatever stops on Ctrl-C still does."""
