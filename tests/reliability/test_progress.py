"""Progress: long commands show progress on a terminal (or when asked), in a fixed width;
training says how each epoch went wherever its stderr goes."""

from __future__ import annotations

import json
import re

import pytest
from support.cli import COMMAND, invoke
from support.guarantees import EPOCH_LINE, write_zero_samples
from support.image_folders import tiny_training, write_image_folder


def test_train_progress_bar_keeps_its_width_at_60_columns():
    import io

    from bnnexport.training.loop import progress_bars

    stream = io.StringIO()
    bar, status = progress_bars(range(80), 0, 5, True, file=stream, ncols=60)
    for step in bar:
        if step == 40:
            status.set_description_str("loss 0.1234  acc 0.9120  π -3.21")
            bar.refresh()
            break
    lines = [s for s in stream.getvalue().replace("\x1b[A", "").split("\r") if s.strip()]
    bar_line = [s for s in lines if s.startswith("epoch 1/5")][-1]
    assert len(bar_line.split("|")[1]) >= 30, bar_line
    assert "loss" not in bar_line and any(s.startswith("loss 0.1234") for s in lines)


def test_bench_shows_progress_when_asked(trained_run, capsys):
    from bnnexport.stages.bench.measure import bench
    from bnnexport.stages.bench.options import BenchOptions

    write_zero_samples(trained_run)
    bench(trained_run, BenchOptions(runs=1, warmup=0, samples=4), write_report=False, progress=True)
    assert "bench" in capsys.readouterr().err


def _epochs_said(stderr: str) -> list[str]:
    """'epoch k/N' of every line of `stderr`; every line must be a whole epoch line."""
    lines = stderr.splitlines()
    assert all(EPOCH_LINE.fullmatch(line) for line in lines), stderr[-1500:]
    return [line.split(":")[0] for line in lines]


def test_train_off_a_terminal_prints_one_plain_line_per_epoch(tmp_path):
    args = ["train", *tiny_training(tmp_path / "data"), "--epochs", "2", "--out", tmp_path / "run"]
    result = invoke(*args)  # stderr is not a terminal here, as in a CI log or `| tee`
    assert result.exit_code == 0, result.output[-1500:]
    assert _epochs_said(result.stderr) == ["epoch 1/2", "epoch 2/2"]  # no bar, nothing else


def test_train_json_keeps_one_object_on_stdout_and_the_epoch_lines_on_stderr(tmp_path):
    args = ["train", *tiny_training(tmp_path / "data"), "--epochs", "2", "--out", tmp_path / "run"]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output[-1500:]
    assert len(result.stdout.splitlines()) == 1 and json.loads(result.stdout)["epochs"] == 2
    assert _epochs_said(result.stderr) == ["epoch 1/2", "epoch 2/2"]


def test_a_library_caller_passing_progress_false_gets_nothing_on_stderr(tmp_path, capfd):
    from bnnexport.stages.train import train
    from bnnexport.training.config import TrainConfig

    data = write_image_folder(tmp_path / "data")
    config = TrainConfig(dataset="imagefolder", data_dir=str(data), epochs=2, batch_size=4,
                         dataset_options={"image_size": 16}, out=str(tmp_path / "run"))  # fmt: skip
    capfd.readouterr()
    train(config, progress=False)
    assert capfd.readouterr().err == ""


@pytest.mark.slow
def test_train_on_a_terminal_shows_its_bars_and_each_epoch_line_once(tmp_path):
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import termios

    args = ["train", *tiny_training(tmp_path / "data"), "--epochs", "2", "--out", tmp_path / "run"]
    terminal, stderr = pty.openpty()
    fcntl.ioctl(stderr, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # 80 columns
    process = subprocess.Popen([*COMMAND, *map(str, args)], stdout=subprocess.DEVNULL,
                               stderr=stderr)  # fmt: skip
    os.close(stderr)
    shown = b""
    try:
        while chunk := os.read(terminal, 4096):  # EIO once the process closed the terminal
            shown += chunk
    except OSError:
        pass
    finally:
        os.close(terminal)
        assert process.wait(timeout=300) == 0, shown.decode()[-1500:]
    text = shown.decode()
    assert "%|" in text  # the live bar
    assert [len(re.findall(rf"epoch {k}/2: loss", text)) for k in (1, 2)] == [1, 1], text[-1500:]
