"""bnnexport.deploy.adb and deploy.transports: the ADB transport against a fake `adb` whose device
is this machine's own shell (support/fake_adb.py), and `--device` addresses read or refused in one
line. The whole bench on an ADB device, the emulated aarch64 one:
tests/deploy/test_bench_aarch64.py."""

from __future__ import annotations

import json

import pytest
from bnnexport.deploy.adb import AdbClient
from bnnexport.deploy.connection import Connection, Reach, parse_identity
from bnnexport.deploy.errors import (
    BadDeviceError,
    DeviceError,
    DeviceTimeoutError,
    DeviceUnreachableError,
    RemoteCommandError,
)
from bnnexport.deploy.transports import open_device
from support.cli import invoke
from support.fake_adb import write_fake_adb

SERIAL = "emulator-5554"


@pytest.fixture
def device(tmp_path):
    """(client, log, tmp): an AdbClient for a fake adb whose device is this machine, working
    under `tmp`, every adb call logged to `log`."""
    log, tmp = tmp_path / "adb.log", tmp_path / "device-tmp"
    tmp.mkdir()
    adb = write_fake_adb(tmp_path / "bin", {SERIAL: ["sh", "-c"]}, log)
    return AdbClient(SERIAL, remote_tmp=str(tmp), adb=str(adb)), log, tmp


def _calls(log) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_an_adb_client_is_a_connection():
    assert isinstance(AdbClient(SERIAL), Connection)


def test_run_returns_the_devices_output_through_adb_shell(device):
    client, log, _ = device
    assert client.run(["echo", "hello device"]).stdout == "hello device\n"
    assert _calls(log) == [["-s", SERIAL, "shell", "echo 'hello device'"]]


def test_a_failed_command_is_one_line_error_with_its_exit_status(device):
    client, _, _ = device
    assert client.run("exit 3", check=False).returncode == 3
    with pytest.raises(RemoteCommandError, match=r"failed on adb:emulator-5554 \(exit 3\)") as info:
        client.run("echo broken >&2; exit 3")
    assert "\n" not in str(info.value) and "broken" in str(info.value)


def test_put_and_get_round_trip_through_adb_push_and_pull(device, tmp_path):
    client, log, _ = device
    (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 40)
    with client.workdir() as work:
        client.put(tmp_path / "a.bin", f"{work}/a.bin")
        client.get(f"{work}/a.bin", tmp_path / "b.bin")
    assert (tmp_path / "b.bin").read_bytes() == (tmp_path / "a.bin").read_bytes()
    verbs = [call[2] for call in _calls(log)]
    assert verbs == ["shell", "push", "pull", "shell"]  # mktemp, push, pull, rm -rf


def test_workdir_is_made_under_remote_tmp_and_removed_when_the_body_fails(device):
    client, _, tmp = device
    with pytest.raises(KeyError), client.workdir() as work:
        assert work.startswith(f"{tmp}/bnnexport.") and len(list(tmp.iterdir())) == 1
        raise KeyError("failure inside the block")
    assert list(tmp.iterdir()) == []


def test_fetching_a_missing_file_is_one_line_error(device, tmp_path):
    client, _, tmp = device
    with pytest.raises(DeviceError, match=r"fetching nothing.bin on adb:emulator-5554 failed"):
        client.get(f"{tmp}/nothing.bin", tmp_path / "nothing.bin")


def test_a_serial_adb_does_not_know_is_unreachable_in_one_line(device):
    client, _, tmp = device
    other = AdbClient("R58M12ABCDE", remote_tmp=str(tmp), adb=client.adb)
    with pytest.raises(DeviceUnreachableError, match="adb devices") as info:
        other.run(["true"])
    assert "device 'R58M12ABCDE' not found" in str(info.value)


def test_the_device_stops_a_command_past_its_limit(device):
    client, _, _ = device
    with pytest.raises(DeviceTimeoutError, match=r"`sleep` on adb:emulator-5554 ran past 1 s"):
        client.run(["sleep", "10"], timeout=1, limit_remote=True)


def test_a_missing_adb_says_which_package_to_install(tmp_path):
    client = AdbClient(SERIAL, adb=str(tmp_path / "no-adb"))
    with pytest.raises(DeviceError, match=r"apt-get install adb"):
        client.run(["true"])


def test_an_android_device_says_its_model_and_release():
    text = "@uname\nLinux localhost 5.10\n@machine\naarch64\n@cores\n8\n@os\n@board\n\n"
    identity = parse_identity(text + "@android\nPixel 7\n14\n")
    assert (identity.os, identity.board, identity.cores) == ("Android 14", "Pixel 7", 8)


def test_open_device_reads_each_form():
    assert open_device("adb:emulator-5554", Reach()).remote_tmp == "/data/local/tmp"
    assert open_device("adb:192.168.1.5:5555", Reach()).serial == "192.168.1.5:5555"
    ssh = open_device("pi@raspberrypi.local", Reach(port=2222))
    assert (ssh.destination, ssh.port, ssh.remote_tmp) == ("pi@raspberrypi.local", 2222, "/tmp")
    assert open_device("ssh://pi@raspberrypi.local", Reach()).destination.startswith("ssh://")


@pytest.mark.parametrize(
    ("address", "reach", "said"),
    [
        ("adbb:R58M12", Reach(), "no transport reads 'adbb:'; give USER@HOST or adb:SERIAL"),
        ("adb:", Reach(), "'' is not an adb serial"),
        ("-oProxyCommand=touch /tmp/x", Reach(), "is not an SSH destination"),
        ("adb:R58M12", Reach(port=22), "--port does not apply to adb:SERIAL"),
    ],
)
def test_a_bad_address_is_a_bad_device_error(address, reach, said):
    with pytest.raises(BadDeviceError, match=said):
        open_device(address, reach)


@pytest.mark.parametrize(
    ("device", "said"),
    [
        (["--device", "adbb:R58M12"], "'adbb:R58M12': no transport reads 'adbb:'"),
        (["--device", "adb:R58M12", "--ssh-key", "k"], "--ssh-key does not apply to adb:SERIAL"),
    ],
)
def test_bench_says_a_bad_device_in_one_line_with_exit_2(device, said, tmp_path):
    result = invoke("bench", tmp_path / "run", *device)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"bnnexport: error: {said}") and result.stderr.count("\n") == 1


def test_bench_help_explains_both_device_forms():
    text = " ".join(invoke("bench", "--help").stdout.split())
    assert "--device USER@HOST|adb:SERIAL" in text
    assert "USER@HOST: a device over SSH" in text and "adb:SERIAL: an Android device" in text
