"""What a bench measures and where: `BenchOptions` (runs, threads, samples, target) and
`DeviceTarget` (the device, the way to reach it, and its runner), shared by the host and the
device halves.

Example:
    >>> BenchOptions(runs=10).threads, DeviceTarget("pi@raspberrypi.local").runner
    (1, 'auto')
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bnnexport.deploy.connection import Reach


@dataclasses.dataclass(frozen=True)
class DeviceTarget:
    """Where and how `bench` runs the LCE flatbuffer on a device, over any transport of
    `deploy.transports` (`address`: `USER@HOST` over SSH, `adb:SERIAL` over ADB).

    Example:
        >>> DeviceTarget("pi@raspberrypi.local", port=2222).reach().port
        2222
        >>> DeviceTarget("adb:R58M12ABCDE").runner
        'auto'
        >>> DeviceTarget("adb:R58M12ABCDE", port=2222)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        bnnexport.deploy.errors.BadDeviceError: --port does not apply to adb:SERIAL ...
    """

    address: str  # `user@host` or an ~/.ssh/config alias (SSH), `adb:SERIAL` (ADB)
    port: int | None = None  # SSH only, as are the key and the options
    ssh_key: str | None = None
    ssh_options: tuple[str, ...] = ()  # `-o KEY=VALUE` options
    runner: str = "auto"  # a name of `deploy.runners`, or auto (the first the device can run)
    benchmark_binary: str | None = None  # a local lce_benchmark_model to upload
    remote_python: str = "python3"
    # where working directories go on the device; None: the transport's own (/tmp over SSH,
    # /data/local/tmp over ADB)
    remote_tmp: str | None = None
    timeout: float = 600.0  # seconds one device command may run
    batch: int = 64  # accuracy with lce_benchmark_model: the batch-N copy's N (capped by samples)
    # the device's op profile by PyTorch layer (bnnexport.stages.bench.profile); needs a runner that
    # profiles
    profile: bool = False

    def __post_init__(self) -> None:
        from bnnexport.deploy.runners import check_runner
        from bnnexport.deploy.transports import open_device

        open_device(self.address, self.reach())  # a bad address fails here, contacting nothing
        check_runner(self.runner, self.profile)

    def reach(self) -> Reach:
        """How to reach the device besides its address, for `deploy.transports.open_device`."""
        from bnnexport.deploy.connection import Reach

        return Reach(self.remote_tmp, self.port, self.ssh_key, self.ssh_options)


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """What `bench` measures and how (the `bnnexport bench` options other than the device's).

    Example:
        >>> BenchOptions(runs=20, samples=None).threads
        1
    """

    runs: int = 100  # timed batch-1 runs per backend
    warmup: int = 10  # untimed runs before them
    threads: int = 1  # for every runtime (PyTorch, ONNX Runtime, TFLite, LCE, the device)
    samples: int | None = 1000  # the first N of samples.npz; None = all
    target: str = "arm64"  # which LCE flatbuffer: model-TARGET.tflite
    # further thread counts the device's LCE latency is measured at (one row each)
    scaling_threads: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.runs < 1 or self.threads < 1 or self.warmup < 0:
            raise ValueError("runs and threads must be at least 1, warmup at least 0")
        if any(t < 1 for t in self.scaling_threads):
            raise ValueError("scaling_threads must all be at least 1")
        if self.samples is not None and self.samples < 1:
            raise ValueError("samples must be at least 1 (or None for all)")
