"""A real OpenSSH server on 127.0.0.1 for the device tests, with throw-away keys.

tests/conftest.py registers it as a plugin for every test.
The server runs as the current user on a free high port with its own host key, an authorized
user key and a known_hosts file, so host-key checking stays on in every test.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from bnnexport.deploy.emulator import free_port, keygen

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
SFTP_CANDIDATES = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
)


class LoopbackSsh:
    """An SSH server on 127.0.0.1 reached with a test key and its own known_hosts: what the
    loopback sshd and the emulated aarch64 device share (both dataclasses with `user`, `port`,
    `key`, `known_hosts`, `remote_tmp` and `host_tmp`)."""

    CONNECT_TIMEOUT = 5  # seconds

    @property
    def destination(self) -> str:
        return f"{self.user}@127.0.0.1"

    @property
    def options(self) -> list[str]:
        return [
            f"UserKnownHostsFile={self.known_hosts}",
            "StrictHostKeyChecking=yes",
            "GlobalKnownHostsFile=/dev/null",
        ]

    def client(self, **kwargs):
        from bnnexport.deploy.ssh import SshClient

        settings = dict(
            port=self.port,
            identity_file=self.key,
            options=self.options,
            remote_tmp=str(self.remote_tmp),
            connect_timeout=self.CONNECT_TIMEOUT,
        )
        settings.update(kwargs)
        return SshClient(self.destination, **settings)

    def leftovers(self) -> list[str]:
        """What is left in the server's temporary directory."""
        return sorted(p.name for p in self.host_tmp.iterdir())


@dataclasses.dataclass
class Sshd(LoopbackSsh):
    """What a test needs to talk to the server."""

    port: int
    user: str
    key: Path
    other_key: Path  # a valid key the server does not accept
    known_hosts: Path
    remote_tmp: Path  # where the tests' working directories must be made (and vanish)

    @property
    def host_tmp(self) -> Path:
        """`remote_tmp` as this machine sees it: the same path, the server being this machine."""
        return self.remote_tmp

    @staticmethod
    def closed_port() -> int:
        """A port on 127.0.0.1 where nothing listens: an unreachable device."""
        return free_port()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """Start sshd on 127.0.0.1:<free port>; stop it after the session."""
    binary = next((p for p in SSHD_CANDIDATES if os.access(p, os.X_OK)), shutil.which("sshd"))
    if binary is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH server/client not installed (`make test` installs them)")
    sftp = next((p for p in SFTP_CANDIDATES if os.access(p, os.X_OK)), None)
    root = tmp_path_factory.mktemp("sshd")
    for name in ("host", "user", "other"):
        keygen(root / name)
    (root / "authorized_keys").write_text((root / "user.pub").read_text())
    port = free_port()
    config = root / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {root / 'host'}",
                f"PidFile {root / 'sshd.pid'}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                "StrictModes no",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin yes",
                f"AllowUsers {getpass.getuser()}",
                "MaxStartups 100",
                "LogLevel ERROR",
                *([f"Subsystem sftp {sftp}"] if sftp else []),
                "",
            ]
        )
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    host_pub = (root / "host.pub").read_text().split()
    known = root / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    log = (root / "sshd.log").open("w")
    process = subprocess.Popen([binary, "-D", "-e", "-f", str(config)], stdout=log, stderr=log)
    remote_tmp = root / "device-tmp"
    remote_tmp.mkdir()
    server = Sshd(
        port=port,
        user=getpass.getuser(),
        key=root / "user",
        other_key=root / "other",
        known_hosts=known,
        remote_tmp=remote_tmp,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                pytest.skip(f"sshd did not start: {(root / 'sshd.log').read_text()[-300:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.skip("sshd did not listen within 20 s")
                time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


TINY_MODEL_SOURCE = '''
import sys
import numpy as np
import tensorflow as tf
import larq_compute_engine as lce


class Tiny(tf.Module):
    """sign -> binary 3x3 conv (constant +-1 filter) -> pad -> dense: one LceBconv2d."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.w = tf.constant(np.where(rng.standard_normal((3, 3, 32, 16)) >= 0, 1.0, -1.0)
                             .astype(np.float32))
        self.d = tf.constant(rng.standard_normal((16 * 8 * 8, 10)).astype(np.float32) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([1, 8, 8, 32], tf.float32)])
    def __call__(self, x):
        b = tf.where(x >= 0, 1.0, -1.0)
        y = tf.nn.conv2d(b, self.w, 1, "VALID")
        y = tf.pad(y, [[0, 0], [1, 1], [1, 1], [0, 0]])
        return tf.matmul(tf.reshape(y, [1, -1]), self.d)


out = sys.argv[1]
tf.saved_model.save(Tiny(), out + "/saved_model")
open(out + "/tiny.tflite", "wb").write(lce.convert_saved_model(out + "/saved_model", target="arm"))
'''


@pytest.fixture(scope="session")
def tiny_flatbuffer(tmp_path_factory) -> Path:
    """A tiny LCE flatbuffer (one LceBconv2d) taking NHWC input, as its metadata declares, as
    bnnexport's do (`converters.flatbuffer.input_layout`); converted in a subprocess, TF stays
    out of pytest."""
    from bnnexport.converters.flatbuffer import layout_metadata, with_metadata

    pytest.importorskip("larq_compute_engine")
    root = tmp_path_factory.mktemp("tiny")
    (root / "make.py").write_text(TINY_MODEL_SOURCE)
    subprocess.run(
        [sys.executable, str(root / "make.py"), str(root)], check=True, capture_output=True
    )
    flatbuffer = root / "tiny.tflite"
    flatbuffer.write_bytes(with_metadata(flatbuffer.read_bytes(), layout_metadata("nhwc")))
    return flatbuffer


@pytest.fixture(scope="session")
def tiny_samples(tmp_path_factory) -> Path:
    """12 NCHW samples for the tiny model (bnnexport's samples: `Samples.fed()` gives them the
    flatbuffer's NHWC), labels 0..9."""
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("samples") / "samples.npz"
    np.savez(
        path,
        inputs=rng.standard_normal((12, 32, 8, 8)).astype(np.float32),
        labels=rng.integers(0, 10, 12).astype(np.int64),
    )
    return path
