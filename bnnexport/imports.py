"""Import strings, `module:attribute`: your own model factory or data set loader on the command
line (`--model mynets:small_bnn`, `--dataset mydata:load`).

The string is what a run records (config.json, the checkpoint), so `export`, `convert`, `bench`
and `--resume` import the same object again. The module is imported as Python would import it,
with the current directory on the path first (as `python -m` puts it there). The run records
the source file that defines the object too (`source_of`: its path and SHA-256), so a later
stage can say when that file changed since (`changed_source`).

Example:
    >>> import_object("math:sqrt", "--model")(4.0)
    2.0
    >>> import_object("math:nothing", "--model")
    Traceback (most recent call last):
    ...
    bnnexport.errors.ConfigError: --model math:nothing: module math has no attribute 'nothing'
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bnnexport.errors import BnnExportError, ConfigError


def is_import_string(name: str) -> bool:
    """True for `module:attribute` (a registered name never holds a colon)."""
    return ":" in name


def import_object(spec: str, option: str) -> Any:
    """The object `spec` ("package.module:attribute") names; ConfigError (one line, naming
    `option`) when the string is malformed, the module does not import or lacks the name."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute.isidentifier():
        raise ConfigError(f"{option} {spec}: expected module:attribute, e.g. mynets:small_bnn")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module may raise anything while importing
        detail = str(error).splitlines()[0] if str(error) else ""
        raise ConfigError(
            f"{option} {spec}: cannot import {module_name} ({type(error).__name__}: {detail})"
        ) from None
    if not hasattr(module, attribute):
        raise ConfigError(f"{option} {spec}: module {module_name} has no attribute {attribute!r}")
    return getattr(module, attribute)


def call_with_accepted(function: Callable[..., Any], option: str, **kwargs: Any) -> Any:
    """`function(**kwargs)` with only the keyword arguments it accepts (all with **kwargs).

    An error of bnnexport's own passes through; any other exception the user's function raises
    becomes a ConfigError naming `option`, its type and first line (one line, exit 2)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        raise ConfigError(f"{option}: {function!r} is not a function to call") from None
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        names = {p.name for p in parameters}
        kwargs = {key: value for key, value in kwargs.items() if key in names}
    try:
        return function(**kwargs)
    except BnnExportError:
        raise
    except Exception as error:
        detail = str(error).splitlines()[0] if str(error) else ""
        raise ConfigError(f"{option} failed: {type(error).__name__}: {detail}") from None


def source_of(spec: str) -> dict[str, str] | None:
    """{"path", "sha256"} of the Python file that defines the object `spec` names (a factory's
    own module, or where it was defined when imported from elsewhere); None for a registered
    name, or an object without a source file."""
    if not is_import_string(spec):
        return None
    found = import_object(spec, "--model")
    try:
        path = inspect.getsourcefile(found) or inspect.getfile(found)
    except TypeError:  # a builtin, or an object of no file
        return None
    path = os.path.abspath(path)
    return {"path": path, "sha256": _sha256(path)} if os.path.isfile(path) else None


def changed_source(recorded: Any) -> str | None:
    """Why the source file a run `recorded` (`source_of`) is no longer the one it trained
    with, in one line: changed or gone; None when it is unchanged (or nothing was recorded)."""
    if not isinstance(recorded, dict) or "path" not in recorded or "sha256" not in recorded:
        return None
    path = recorded["path"]
    if not os.path.isfile(path):
        return f"the model's source {path} is gone: the model is rebuilt from whatever imports now"
    now = _sha256(path)
    if now == recorded["sha256"]:
        return None
    return (
        f"the model's source {path} changed since the run recorded it (sha256 "
        f"{recorded['sha256'][:12]} -> {now[:12]}): the model rebuilt from it may not be the "
        "one trained"
    )


def _sha256(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def user_frame(error: BaseException) -> str | None:
    """ "FILE:LINE, in FUNCTION" of the frame that raised `error` when it is the user's own code
    (not torch's, bnnexport's, the standard library's or an installed package's; FILE relative
    to the current directory when below it), else None."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames or _is_library(frames[-1].filename):
        return None
    last = frames[-1]
    path = os.path.abspath(last.filename)
    shown = os.path.relpath(path) if _below(path, os.getcwd()) else path
    return f"{shown}:{last.lineno}, in {last.name}"


def _libraries() -> tuple[str, ...]:
    import torch

    here = os.path.dirname(os.path.abspath(__file__))  # bnnexport itself
    paths = sysconfig.get_paths()
    return (os.path.dirname(torch.__file__), here, paths["stdlib"], paths["purelib"],
            paths["platlib"])  # fmt: skip


def _is_library(filename: str) -> bool:
    return filename.startswith("<") or any(_below(filename, root) for root in _libraries())


def _below(filename: str, root: str) -> bool:
    return os.path.abspath(filename).startswith(os.path.abspath(root) + os.sep)
