"""Errors from talking to a device, one type per kind, each a one-line message with exit code 2.

`deploy` never imports bnnexport; the bnnexport CLI turns any exception carrying an integer
`exit_code` into `bnnexport: error: MESSAGE` and that exit code.

Example:
    >>> from bnnexport.deploy.errors import DeviceUnreachableError
    >>> DeviceUnreachableError("cannot reach pi@raspberrypi: Connection refused").exit_code
    2
"""

from __future__ import annotations


class DeviceError(Exception):
    """Base class: the device or the way to it is wrong (bad environment, exit code 2)."""

    exit_code = 2


class BadDeviceError(DeviceError, ValueError):
    """The device's address is spelt in no form a transport reads, or comes with options its
    transport does not take (`deploy.transports`)."""


class DeviceUnreachableError(DeviceError):
    """The host does not answer: closed port, unknown name, no route, connect timeout."""


class DeviceAuthError(DeviceError):
    """The device refused us: an SSH key not accepted or a host key unknown or changed, an
    Android device that has not authorized this machine for USB debugging."""


class MissingBinaryError(DeviceError):
    """`lce_benchmark_model` (or python3 / larq_compute_engine for the runner) is not there."""


class WrongArchitectureError(DeviceError):
    """The benchmark binary was built for another CPU architecture than the device's."""


class DeviceTimeoutError(DeviceError):
    """A command on the device ran past its time limit and was stopped."""


class RemoteCommandError(DeviceError):
    """A command on the device failed; the message carries the last line it printed."""


class BenchmarkOutputError(DeviceError):
    """The output of `lce_benchmark_model` could not be parsed (no timing line found)."""


class UnknownRunnerError(DeviceError, ValueError):
    """No device runner of that name is registered (`deploy.runners`); the message names them."""


class EmulatorUnavailableError(DeviceError):
    """The emulated aarch64 device cannot run on this machine (no root, Debian packages
    missing, binfmt not registrable, sshd not starting); the message says why."""


class EmulatorStateError(DeviceError):
    """`bnnexport device stop` / `status` found no emulated device running in that folder, or
    `start` found one already there."""
