"""What every command shares: one-line errors with exit codes, and printing reports."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from bnnexport.errors import ConfigError, DependencyError, TrainingInterrupted
from bnnexport.stages.report import Report

F = TypeVar("F", bound=Callable[..., Any])

# Imported only by the stages that need them; missing, they are an environment problem (exit 2).
OPTIONAL_MODULES = {
    "tensorflow": "tensorflow-cpu==2.21.0", "larq_compute_engine": "larq-compute-engine==0.16.0",
    "onnxruntime": "onnxruntime", "onnx": "onnx", "onnxscript": "onnxscript",
    "matplotlib": "matplotlib", "safetensors": "safetensors",
}  # fmt: skip

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print exactly one JSON object on stdout, no table."
)


def count_option(
    *names: str, default: int | None, help: str, minimum: int = 1, **extra: Any
) -> Callable[[F], F]:
    """A click option taking an integer >= `minimum`; `--help` shows the default when there is
    one (a None default is explained in `help`)."""
    return click.option(
        *names,
        type=click.IntRange(min=minimum),
        default=default,
        show_default=default is not None,
        help=help,
        **extra,
    )


class CountList(click.ParamType):
    """Comma-separated integers >= 1, each once: "1,2,4" -> (1, 2, 4)."""

    name = "N[,N...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        try:
            counts = tuple(int(part) for part in str(value).split(","))
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of integers", param, ctx)
        if any(c < 1 for c in counts) or len(set(counts)) != len(counts):
            self.fail(f"{value!r}: every count must be at least 1 and listed once", param, ctx)
        return counts


def choice_option(
    *names: str, choices: Sequence[str], default: str | None, help: str, **extra: Any
) -> Callable[[F], F]:
    """A click option taking one of `choices` (an unknown value is a one-line exit 2);
    `--help` lists them and shows the default when there is one."""
    return click.option(
        *names,
        type=click.Choice(list(choices)),
        default=default,
        show_default=default is not None,
        help=help,
        **extra,
    )


class NameOrImport(click.ParamType):
    """One of `choices`, or an import string `module:attribute` of your own (checked when it
    is imported, `bnnexport.imports`)."""

    def __init__(self, choices: Sequence[str], what: str) -> None:
        self.choices = list(choices)
        self.what = what
        self.name = f"[{'|'.join(self.choices)}|module:{what}]"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        value = str(value)
        if value in self.choices or ":" in value:
            return value
        self.fail(
            f"{value!r} is not one of {', '.join(self.choices)}, nor an import string "
            f"module:{self.what}",
            param,
            ctx,
        )


def name_or_import_option(
    *names: str, choices: Sequence[str], what: str, default: str, help: str
) -> Callable[[F], F]:
    """A click option taking a registered name or `module:WHAT` (a one-line exit 2 otherwise)."""
    return click.option(
        *names, type=NameOrImport(choices, what), default=default, show_default=True, help=help
    )


class FloatList(click.ParamType):
    """Comma-separated finite numbers: "0.5,0.4,0.3" -> [0.5, 0.4, 0.3]."""

    name = "X[,X...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[float]:
        if isinstance(value, list):
            return value
        try:
            numbers = [float(part) for part in str(value).split(",")]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of numbers", param, ctx)
        return numbers


class NameList(click.ParamType):
    """Comma-separated names or shell-style globs, each once: "w1,b*.w" -> ["w1", "b*.w"]."""

    name = "NAME[,NAME...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[str]:
        if isinstance(value, list):
            return value
        names = [part.strip() for part in str(value).split(",")]
        if not all(names) or len(set(names)) != len(names):
            self.fail(f"{value!r}: expected distinct names, comma-separated", param, ctx)
        return names


def given_options(ctx: click.Context) -> set[str]:
    """The names of the options the user typed (not defaults)."""
    return {
        name
        for name in ctx.params
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    }


class ImageSize(click.ParamType):
    """An image size: "N" (N x N), "HxW" or "H,W" (height x width), or "imagenet" (ImageNet's
    random-resized 224 crops), every side at least 4 pixels. Converts to the form config.json
    records (`bnnexport.datasets.imagefolder.parse_image_size`): N, [H, W] or "imagenet"; a bad
    value is one line, `--image-size abc: ...`."""

    name = "N|HxW|imagenet"

    def convert(self, value: Any, param: Any, ctx: Any) -> int | list[int] | str:
        from bnnexport.datasets.imagefolder import parse_image_size
        from bnnexport.errors import DataError

        try:
            return parse_image_size(value)
        except DataError as error:
            raise click.UsageError(str(error), ctx) from None


def fail(message: str, exit_code: int = 2, as_json: bool = False) -> None:
    """Print `bnnexport: error: MESSAGE` on stderr and exit; with `as_json` also print
    `{"error": MESSAGE, "exit_code": CODE}` on stdout, so a script always gets one object."""
    message = " ".join(message.split())  # one line, whatever the message held
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": exit_code}))
    click.echo(f"bnnexport: error: {message}", err=True)
    sys.exit(exit_code)


def handle_errors(func: F) -> F:
    """Turn the library's errors (and a few common OS ones) into one line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return func(*args, **kwargs)
        except TrainingInterrupted as interrupt:
            fail(str(interrupt), 130, as_json)  # names the checkpoint and `--resume`
        except KeyboardInterrupt:
            fail("interrupted", 130, as_json)
        except click.ClickException:
            raise  # the group turns these into one line (cli.BnnExportGroup)
        except Exception as error:
            # BnnExportError, and converters.errors / deploy.errors, which carry exit_code too
            code = getattr(error, "exit_code", None)
            if isinstance(code, int):
                fail(str(error), code, as_json)
            missing = _missing_module(error)
            if missing is not None:
                fail(str(missing), missing.exit_code, as_json)
            if isinstance(error, PermissionError):
                fail(f"permission denied: {error.filename or error}", 2, as_json)
            if isinstance(error, OSError) and error.errno == 28:  # ENOSPC
                message = f"no space left on device while writing {error.filename or ''}"
                fail(message.strip(), 2, as_json)
            if isinstance(error, OSError) and error.errno == 30:  # EROFS
                fail(f"read-only file system: {error.filename or error}", 2, as_json)
            raise

    return wrapper  # type: ignore[return-value]


def _missing_module(error: Exception) -> DependencyError | None:
    """A DependencyError for an optional package that is not installed (or will not import)."""
    if not isinstance(error, ImportError):
        return None
    top = (error.name or "").split(".")[0]
    if top not in OPTIONAL_MODULES:
        return None
    return DependencyError(
        f"{top} is missing or broken ({error}): pip install {OPTIONAL_MODULES[top]!r} "
        "(the Makefile pins the whole stack)"
    )


def locks_run(argument: str) -> Callable[[F], F]:
    """Hold the run directory named by the command's `argument` locked while the command runs
    (bnnexport.run.directory.lock_run): a second writer to the same directory gets one line, exit 2.
    A path that is a file (a checkpoint, an ONNX model) is not locked."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from pathlib import Path

            from bnnexport.run.directory import lock_run

            path = Path(kwargs[argument])
            if not path.is_dir():
                return func(*args, **kwargs)
            with lock_run(path):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def emit(report: Report | dict[str, Any], as_json: bool, title: str | None = None) -> None:
    """Print a report: one JSON object with `--json`, else an aligned table (with a title)."""
    data = report.to_json() if isinstance(report, Report) else report
    if as_json:
        click.echo(json.dumps(data))
        return
    if title:
        click.echo(title)
    if isinstance(report, Report):
        click.echo(report.to_table())
    else:
        width = max((len(k) for k in data), default=0)
        for key, value in data.items():
            click.echo(f"{key.ljust(width)}  {value}")


def number_or_schedule(value: str) -> float | str:
    """A --lr/--gamma/--threshold value: a number, or a schedule string checked here (one
    ConfigError line when it is neither)."""
    try:
        return float(value)
    except ValueError:
        from bnnexport.optim.schedules import parse_schedule

        try:
            parse_schedule(value)
        except ValueError as error:
            raise ConfigError(f"{value!r}: {error}") from None
        return value
