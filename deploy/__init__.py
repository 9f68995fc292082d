"""What runs on or talks to a device: the SSH client, the device runners, an emulated device.

`ssh` is the client (the system's OpenSSH), `errors` the one-line errors of talking to a device,
`runners/` the ways to run an LCE flatbuffer on a device, one package per runner behind one
protocol (`runners/registry.py`), and `emulator` a Debian arm64 device under qemu-user on this
machine (`bnnexport device`, and the device tests' fixture). Never imports bnnexport or
converters; the python runner's device script (`runners/python/device_script.py`) imports only
the standard library, numpy and larq_compute_engine, because it is copied to the device and
run there.

Example:
    >>> from deploy.ssh import SshClient
    >>> from deploy.runners.lce_benchmark_model import run_lce_benchmark
    >>> client = SshClient("pi@raspberrypi.local")                      # doctest: +SKIP
    >>> result, _ = run_lce_benchmark(client, "model-arm64.tflite")     # doctest: +SKIP
"""
