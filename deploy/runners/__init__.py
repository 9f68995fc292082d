"""Device runners: one package per way to run an LCE flatbuffer on a device, behind one protocol.

Each package holds all of its runner's code (this machine's side and the device's) and registers
its runner on import (`@register_runner`) with its place in the order `auto` tries them:
`python` (bnnexport's own runner, where the device's Python has LCE), then `lce_benchmark_model`
(LCE's stock benchmark tool). `bnnexport bench --runner` takes `auto` and
every registered name; bench calls only the protocol (`DeviceRunner`).

Example:
    >>> from bnnexport.deploy.runners import runner_choices
    >>> runner_choices()
    ['auto', 'python', 'lce_benchmark_model']
"""

from bnnexport.deploy.runners import lce_benchmark_model, python  # noqa: F401  (each registers its runner)
from bnnexport.deploy.runners.registry import (
    AUTO,
    LATENCY_KEYS,
    DeviceRunner,
    Measurement,
    RunSettings,
    Samples,
    candidates,
    check_runner,
    get_runner,
    pick_runner,
    register_runner,
    runner_choices,
    runner_names,
    unregister_runner,
)

__all__ = [
    "AUTO",
    "LATENCY_KEYS",
    "DeviceRunner",
    "Measurement",
    "RunSettings",
    "Samples",
    "candidates",
    "check_runner",
    "get_runner",
    "pick_runner",
    "register_runner",
    "runner_choices",
    "runner_names",
    "unregister_runner",
]
