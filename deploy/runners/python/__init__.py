"""The `python` runner: bnnexport's own script, run on the device under its Python with LCE.

Both halves of the runner live here. `python_runner` runs on this machine: the `DeviceRunner`
that copies the script, the model and the samples into a fresh directory on the device
(a `deploy.connection.Connection`), runs the script and fetches its outputs; it may import
`deploy.connection`,
`deploy.errors` and `deploy.runners.registry`. `device_script` is the script the device runs:
it imports only the standard library, numpy and larq_compute_engine, because it is copied to the
device by its path (`python_runner.DEVICE_SCRIPT`) and run there alone; this machine imports it only
for the statistics both sides share (`latency_stats`, `topk_accuracy`).

Importing the package registers the runner as `python` (order 10: `auto` tries it first).

Example:
    >>> from bnnexport.deploy.runners.python import PythonRunner, run_remote_runner
    >>> PythonRunner.profiles
    False
    >>> result, outputs = run_remote_runner(client, "model-arm64.tflite")  # doctest: +SKIP
"""

from bnnexport.deploy.runners.python.python_runner import (
    PythonRunner,
    has_lce_python,
    run_remote_runner,
)

__all__ = ["PythonRunner", "has_lce_python", "run_remote_runner"]
