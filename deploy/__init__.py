"""What runs on or talks to a device: SSH client, device-side runner, lce_benchmark_model.

Never imports bnnexport; the device-side runner (`deploy/runner.py`) imports only the standard
library, numpy and larq_compute_engine, because it is copied to the device and run there.

Example:
    >>> from deploy.ssh import SshClient
    >>> from deploy.lce_benchmark import run_lce_benchmark
    >>> client = SshClient("pi@raspberrypi.local")                      # doctest: +SKIP
    >>> result, _ = run_lce_benchmark(client, "model-arm64.tflite")     # doctest: +SKIP
"""
