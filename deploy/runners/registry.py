"""The device runners behind one protocol: `@register_runner(name)`, `get_runner(name)`.

A runner runs an LCE flatbuffer on a device reached by any transport (a
`deploy.connection.Connection`: SSH, ADB): it says
whether the device can run it, measures latency at a thread count, computes the outputs on test
samples for accuracy, and says what else it gives (`profiles`: an op profile in its measurement;
`batched_copy`: its outputs need the flatbuffer converted at batch N). Registry order (each
runner's `order`, lowest first) decides `auto`: the first runner the device can run, among those
that profile when a profile is asked for.

Example:
    >>> from bnnexport.deploy.runners import get_runner, runner_names
    >>> runner_names()
    ['python', 'lce_benchmark_model']
    >>> get_runner("lce_benchmark_model").profiles
    True
    >>> get_runner("tflite")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bnnexport.deploy.errors.UnknownRunnerError: unknown runner 'tflite'; choose from auto, ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from bnnexport.deploy.connection import Connection
from bnnexport.deploy.errors import MissingBinaryError, UnknownRunnerError

AUTO = "auto"  # not a runner: the first registered one the device can run
LATENCY_KEYS = ("min", "median", "p90", "mean", "std")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How a runner runs the flatbuffer: bench's measuring options and the device's settings."""

    threads: int = 1
    runs: int = 100  # timed batch-1 runs
    warmup: int = 10  # untimed runs before them
    timeout: float = 600.0  # seconds one command on the device may run
    benchmark_binary: str | None = None  # a local lce_benchmark_model to upload
    remote_python: str = "python3"  # the device's Python, for bnnexport's own runner
    # LCE's indirect BGEMM bconv kernels: True for a flatbuffer LCE's default kernel refuses (a
    # grouped LceBconv2d); None leaves each runner's own choice (the tool's default kernels;
    # the python runner always takes indirect BGEMM, which runs every LCE flatbuffer)
    use_indirect_bgemm: bool | None = None


# the input layouts a flatbuffer's metadata may declare (bnnexport's `input_layout` entry)
INPUT_LAYOUTS = ("nhwc", "nchw")


@dataclasses.dataclass(frozen=True)
class Samples:
    """The test samples whose outputs a runner computes on the device.

    `copy` is the flatbuffer converted at batch `batch`, for a runner whose outputs need one
    (`batched_copy`); None when there is none, and that runner then measures latency only.
    `input_layout` is what the flatbuffer the samples are fed to declares (bench reads its
    metadata on the host): "nhwc" takes them with the channels last; "nchw" or None (no
    layout declared) as they are. A runner sends `fed()`, never `inputs` itself.
    """

    inputs: np.ndarray  # float32, NCHW, one sample per row
    labels: np.ndarray  # int64, negative where there is no ground truth
    outputs_per_sample: int
    copy: Path | None = None
    batch: int = 1
    input_layout: str | None = None

    def __post_init__(self) -> None:
        if self.input_layout not in (None, *INPUT_LAYOUTS):
            raise ValueError(f"unknown input layout {self.input_layout!r}")

    def fed(self) -> np.ndarray:
        """The inputs as the flatbuffer takes them: float32, C-contiguous, NHWC for an "nhwc"
        flatbuffer (the one place of the device side that puts samples in a flatbuffer's
        layout, as `converters.flatbuffer.to_input_layout` is on the host).

        Example:
            >>> nchw = np.zeros((2, 3, 4, 5), np.float32)
            >>> Samples(nchw, np.zeros(2), 10, input_layout="nhwc").fed().shape
            (2, 4, 5, 3)
        """
        inputs = np.asarray(self.inputs, np.float32)
        if self.input_layout == "nhwc":
            inputs = inputs.transpose(0, 2, 3, 1)
        return np.ascontiguousarray(inputs)


@dataclasses.dataclass
class Measurement:
    """What a runner measured: latency in ms (keys `LATENCY_KEYS`, None where the runner has no
    such statistic), the row's runner-specific fields, and the outputs when it computed them."""

    latency: dict[str, float | None]
    extra: dict[str, Any]
    outputs: np.ndarray | None = None  # (samples, outputs_per_sample) float32
    raw: str | None = None  # what the device printed, kept as a log
    note: str | None = None  # why there are no outputs, when samples were given and there are none


class DeviceRunner(Protocol):
    """What every device runner can do; its package registers it with `@register_runner`."""

    name: str  # set by `register_runner`
    order: int  # its place in registry order, set by `register_runner`
    profiles: bool  # its measurement carries the op profile (`extra["ops"]`)
    batched_copy: bool  # its outputs need `Samples.copy`, the flatbuffer at batch N

    def available(self, client: Connection, settings: RunSettings) -> bool:
        """Whether the connected device can run it (asked by `auto` only)."""
        ...

    def preflight(self, machine: str, settings: RunSettings) -> None:
        """Fail now, before any long work, on what cannot run on a `uname -m` machine."""
        ...

    def measure(
        self, client: Connection, flatbuffer: Path, settings: RunSettings, samples: Samples | None
    ) -> Measurement:
        """Latency at `settings.threads` and, given samples, the outputs on them."""
        ...

    def latency(
        self, client: Connection, flatbuffer: Path, settings: RunSettings, samples: Samples | None
    ) -> Measurement:
        """Latency at `settings.threads`; with outputs only where the same timing run yields
        them at no extra cost."""
        ...


R = TypeVar("R")
_RUNNERS: dict[str, Any] = {}


def register_runner(name: str, order: int = 100) -> Callable[[type[R]], type[R]]:
    """Class decorator: register one instance of the class as the runner `name`, at `order` in
    registry order (lowest first: what `auto` tries first; equal orders in registration order)."""

    def decorate(cls: type[R]) -> type[R]:
        cls.name, cls.order = name, order  # type: ignore[attr-defined]
        _RUNNERS[name] = cls()
        return cls

    return decorate


def _registered() -> list[Any]:
    """The runners in registry order."""
    return sorted(_RUNNERS.values(), key=lambda runner: runner.order)


def unregister_runner(name: str) -> None:
    """Remove the runner `name` (a test's own runner, after the test)."""
    _RUNNERS.pop(name, None)


def runner_names(profiles: bool = False) -> list[str]:
    """The registered runners in registry order (with `profiles`, only those that profile)."""
    return [r.name for r in _registered() if r.profiles or not profiles]


def runner_choices() -> list[str]:
    """What `--runner` takes: `auto`, then every registered runner."""
    return [AUTO, *runner_names()]


def get_runner(name: str) -> DeviceRunner:
    """The runner registered as `name`; UnknownRunnerError naming the choices otherwise."""
    if name not in _RUNNERS:
        raise UnknownRunnerError(
            f"unknown runner {name!r}; choose from {', '.join(runner_choices())}"
        )
    return _RUNNERS[name]


def candidates(name: str, profile: bool = False) -> list[DeviceRunner]:
    """The runners `name` may turn out to be: itself, or for `auto` every registered one in
    order; with `profile`, only those that profile (an empty list: none can)."""
    runners = _registered() if name == AUTO else [get_runner(name)]
    return [r for r in runners if r.profiles or not profile]


def check_runner(name: str, profile: bool = False) -> None:
    """Raise unless `name` is `auto` or registered, and can profile when `profile` asks it to."""
    if not candidates(name, profile):
        raise ValueError(
            f"profile needs the {' or '.join(runner_names(profiles=True))} runner "
            f"(the {name} runner has no op profiler)"
        )


def pick_runner(
    name: str, client: Connection, settings: RunSettings, profile: bool = False
) -> DeviceRunner:
    """The runner `name` names; for `auto`, the first candidate the device can run."""
    if name != AUTO:
        return get_runner(name)
    runners = candidates(name, profile)
    for runner in runners:
        if runner.available(client, settings):
            return runner
    tried = ", ".join(r.name for r in runners) or "none registered"
    raise MissingBinaryError(f"no device runner can run on {client.destination} (tried {tried})")
