"""What runs on or talks to a device: the transports (SSH, ADB) behind one connection protocol,
the device runners, an emulated device.

`connection` is the seam: the `Connection` protocol every transport implements and the runners
are typed against, with what transports share; `transports` imports each transport and opens
a `--device` address (`ssh`: the system's OpenSSH, `USER@HOST`; `adb`: the Android Debug
Bridge, `adb:SERIAL`). `errors` holds the one-line errors of talking to a device,
`runners/` the ways to run an LCE flatbuffer on a device, one package per runner behind one
protocol (`runners/registry.py`), and `emulator` a Debian arm64 device under qemu-user on this
machine (`bnnexport device`, and the device tests' fixture). Never imports bnnexport or
converters; the python runner's device script (`runners/python/device_script.py`) imports only
the standard library, numpy and larq_compute_engine, because it is copied to the device and
run there.

Example:
    >>> from bnnexport.deploy.connection import Reach
    >>> from bnnexport.deploy.transports import open_device
    >>> from bnnexport.deploy.runners.lce_benchmark_model import run_lce_benchmark
    >>> client = open_device("adb:R58M12ABCDE", Reach())                # or "pi@raspberrypi.local"
    >>> result, _ = run_lce_benchmark(client, "model-arm64.tflite")     # doctest: +SKIP
"""
