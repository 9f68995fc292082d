"""bnnexport bench: host backends on a real trained run, and the device path over a real sshd.

The run is the shared 1-epoch mnist5k training run, exported and converted by the real stages.
The device is this machine reached through sshd on 127.0.0.1, running the python runner's
deploy/runners/python/device_script.py with this interpreter.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from support.cli import invoke
from support.guarantees import snapshot
from support.recorded_outputs import REAL, needs_real  # the real tool's recorded output
from support.stand_in import AARCH64, elf_header

from bnnexport.errors import CheckpointError
from bnnexport.run import provenance
from bnnexport.run.checkpoint import load_model
from bnnexport.stages.bench.measure import bench
from bnnexport.stages.bench.options import BenchOptions

HOST_BACKENDS = ["pytorch", "onnxruntime", "tflite-float", "lce"]
SAMPLES = 200


@pytest.fixture(scope="module")
def _converted_template(_trained_run_template, tmp_path_factory):
    from bnnexport.stages.convert import convert_run
    from bnnexport.stages.export import export_onnx

    run = tmp_path_factory.mktemp("bench") / "run"
    shutil.copytree(_trained_run_template, run)
    export_onnx(run, samples=SAMPLES)
    convert_run(run, target="arm64", fmt="tflite")
    return run


@pytest.fixture
def converted_run(_converted_template, tmp_path):
    """A fresh copy of a trained, exported and converted run (safe to modify)."""
    target = tmp_path / "run"
    shutil.copytree(_converted_template, target)
    return target


@pytest.fixture(scope="module")
def host_report(_converted_template):
    return bench(_converted_template, BenchOptions(runs=5, warmup=2, samples=SAMPLES))


def _device_args(sshd) -> list[str]:
    args = [
        "--device",
        sshd.destination,
        "--port",
        str(sshd.port),
        "--ssh-key",
        str(sshd.key),
        "--remote-tmp",
        str(sshd.remote_tmp),
    ]
    for option in sshd.options:
        args += ["--ssh-option", option]
    return args


def _cli(run, *args):
    return invoke("bench", run, "--runs", "3", "--warmup", "1", "--samples", "50", *args)


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bnnexport: error: "), result.stderr
    return lines[0]


@pytest.mark.slow
def test_every_host_backend_is_measured(host_report):
    assert [b.name for b in host_report.backends] == HOST_BACKENDS
    for backend in host_report.backends:
        lat = backend.latency_ms
        assert 0 < lat["min"] <= lat["median"] <= lat["p90"], backend.name
        assert lat["std"] >= 0 and lat["runs"] == 5
        assert backend.size_bytes > 0 and backend.samples == SAMPLES


def test_lce_matches_pytorch_accuracy_and_argmax(host_report):
    by_name = {b.name: b for b in host_report.backends}
    torch_result = by_name["pytorch"]
    assert torch_result.top1 > 0.5  # a trained model, not chance
    for name in HOST_BACKENDS[1:]:
        assert by_name[name].top1 == torch_result.top1, name
        assert by_name[name].argmax_agreement == 1.0, name
        assert by_name[name].max_abs_diff < 1e-3, name
    assert torch_result.top5 is not None  # 10 classes > 5


def test_lce_flatbuffer_is_much_smaller_than_the_float_model(host_report):
    files = host_report.files
    assert files["model-arm64.tflite"] * 5 < files["model-float.tflite"]


def test_bench_json_has_one_entry_per_backend(host_report, _converted_template):
    saved = json.loads((_converted_template / "bench.json").read_text())
    assert [b["name"] for b in saved["backends"]] == HOST_BACKENDS
    for entry in saved["backends"]:
        assert {"top1", "argmax_agreement", "max_abs_diff"} <= set(entry)
        assert {"min", "median", "p90", "mean", "std"} <= set(entry["latency_ms"])


def test_report_md_links_plots_that_exist(host_report, _converted_template):
    text = (_converted_template / "report.md").read_text()
    for name in ("bench_latency.png", "bench_size.png", "bench_accuracy.png", "accuracy.png"):
        assert f"]({name})" in text
        assert (_converted_template / name).stat().st_size > 1000
    assert "| lce | host |" in text


def test_missing_samples_names_the_command_that_makes_them(converted_run):
    (converted_run / "samples.npz").unlink()
    with pytest.raises(CheckpointError, match="bnnexport export"):
        bench(converted_run, BenchOptions(runs=1, samples=5), write_report=False)
    line = _one_line_error(_cli(converted_run))
    assert "samples.npz" in line and "bnnexport export" in line


@pytest.mark.parametrize(
    ("missing", "backend", "command"),
    [
        ("model-arm64.tflite", "lce", "bnnexport convert"),
        ("model-float.tflite", "tflite-float", "bnnexport convert"),
        ("model.onnx", "onnxruntime", "bnnexport export"),
    ],
)
def test_missing_model_file_skips_its_backend_and_says_why(
    converted_run, missing, backend, command
):
    (converted_run / missing).unlink()
    report = bench(converted_run, BenchOptions(runs=1, samples=5), write_report=False)
    assert backend not in [b.name for b in report.backends]
    assert missing in report.skipped[backend] and command in report.skipped[backend]
    result = _cli(converted_run)
    assert result.exit_code == 0 and f"skipped {backend}: " in result.stdout


def test_cli_json_prints_one_object(converted_run):
    result = _cli(converted_run, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [b["name"] for b in data["backends"]] == HOST_BACKENDS and data["samples"] == 50


def test_cli_table(converted_run):
    result = _cli(converted_run)
    assert result.exit_code == 0, result.output
    assert "median ms" in result.stdout and "report.md" in result.stdout


@pytest.mark.slow
def test_bench_prints_no_tflite_runtime_info_line(converted_run):
    """The stock interpreter's `INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`, printed
    by TFLite's C++ runtime on fd 2 in a fresh process, stays out of bench's output."""
    from support.cli import run_process

    result = run_process("bench", converted_run, "--runs", "2", "--warmup", "0", "--samples", "8")
    assert result.returncode == 0, result.stderr[-1500:]
    assert "tflite-float" in result.stdout  # the backend whose interpreter prints it ran
    assert "XNNPACK" not in result.stderr and "INFO:" not in result.stderr, result.stderr


@pytest.mark.slow
def test_device_runner_end_to_end_over_ssh(converted_run, sshd):
    result = _cli(
        converted_run,
        *_device_args(sshd),
        "--runner",
        "python",
        "--remote-python",
        sys.executable,
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    device = data["backends"][-1]
    pytorch = data["backends"][0]
    assert (device["name"], device["where"]) == ("lce", sshd.destination)
    assert device["argmax_agreement"] == 1.0 and device["top1"] == pytorch["top1"]
    assert device["extra"]["device_accuracy"]["top1"] == pytorch["top1"]
    assert 0 < device["latency_ms"]["min"] <= device["latency_ms"]["median"]
    assert data["device"]["destination"] == sshd.destination and data["device"]["cores"] >= 1
    saved = json.loads((converted_run / "bench.json").read_text())
    assert saved["device"] == data["device"] and len(saved["backends"]) == 5
    assert f"lce | {sshd.destination}" in (converted_run / "report.md").read_text()
    assert list(sshd.remote_tmp.iterdir()) == []


@pytest.mark.slow
def test_auto_runner_picks_lce_benchmark_model_without_python_lce(converted_run, sshd):
    line = _one_line_error(
        _cli(converted_run, *_device_args(sshd), "--remote-python", "/nonexistent/python3")
    )
    assert "lce_benchmark_model is not on the PATH" in line
    assert list(sshd.remote_tmp.iterdir()) == []


def test_unreachable_device(converted_run, sshd):
    args = _device_args(sshd)
    args[args.index("--port") + 1] = str(sshd.closed_port())
    assert "Connection refused" in _one_line_error(_cli(converted_run, *args))


@pytest.fixture
def no_host_benchmark(monkeypatch):
    """Fail the test if any host backend is timed (device checks must come first)."""
    import bnnexport.stages.bench.host

    def refuse(*args, **kwargs):
        raise AssertionError("the host was benchmarked before the device was reached")

    monkeypatch.setattr(bnnexport.stages.bench.host, "time_calls", refuse)


def test_an_unknown_host_fails_in_seconds_before_any_host_benchmark(
    converted_run, no_host_benchmark
):
    import time

    before = snapshot(converted_run)
    started = time.monotonic()
    result = _cli(converted_run, "--device", "pi@no-such-host")
    assert time.monotonic() - started < 5
    assert "no-such-host" in _one_line_error(result)
    assert snapshot(converted_run) == before


def test_refused_key(converted_run, sshd):
    args = _device_args(sshd)
    args[args.index("--ssh-key") + 1] = str(sshd.other_key)
    assert "Permission denied" in _one_line_error(_cli(converted_run, *args))


def test_wrong_architecture_binary(converted_run, sshd, tmp_path, no_host_benchmark):
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("needs this machine (the device) to be x86_64")
    fake = tmp_path / "lce_benchmark_model_aarch64"
    fake.write_bytes(elf_header(AARCH64) + bytes(100))
    line = _one_line_error(
        _cli(
            converted_run,
            *_device_args(sshd),
            "--runner",
            "lce_benchmark_model",
            "--benchmark-binary",
            str(fake),
        )
    )
    assert "built for aarch64 but the device is x86_64" in line
    assert list(sshd.remote_tmp.iterdir()) == []


@pytest.mark.slow
def test_device_timeout(converted_run, sshd):
    # the runner needs seconds to import LCE alone: a 1 s limit always stops it
    line = _one_line_error(
        _cli(
            converted_run,
            *_device_args(sshd),
            "--runner",
            "python",
            "--remote-python",
            sys.executable,
            "--timeout",
            "1",
        )
    )
    assert "ran past 1 s and was stopped" in line
    assert list(sshd.remote_tmp.iterdir()) == []


@pytest.mark.slow
def test_device_lce_benchmark_model_results_join_the_report(converted_run, sshd, tmp_path):
    """The uploaded binary here is a shell script standing in for lce_benchmark_model (no x86
    build of it exists): it prints output in the documented format, op-profiling tables
    included, so what is tested is parse -> bench.json -> report.md."""
    from support.recorded_outputs import TAB_OUTPUT

    (tmp_path / "output.txt").write_text(TAB_OUTPUT)
    stand_in = tmp_path / "lce_benchmark_model"
    stand_in.write_text(f"#!/bin/sh\ncat {tmp_path / 'output.txt'}\n")
    result = _cli(
        converted_run,
        *_device_args(sshd),
        "--runner",
        "lce_benchmark_model",
        "--benchmark-binary",
        str(stand_in),
        "--json",
    )
    assert result.exit_code == 0, result.output
    device = json.loads(result.stdout)["backends"][-1]
    assert device["latency_ms"] == {
        "min": 15.002,
        "median": None,
        "p90": None,
        "mean": pytest.approx(15.4082),
        "std": 0.245,
    }
    # the run had no batch-50 copy: bench converted it (same gate), but this stand-in has no
    # --output_filepath, so latency only, and a note saying why
    assert (converted_run / "model-arm64-b50.tflite").is_file()
    assert provenance.stale_reason(converted_run, "model-arm64-b50.tflite") is None
    assert device["top1"] is None
    assert "has no --output_filepath" in device["extra"]["note"]
    assert "note: " in result.stderr and "has no --output_filepath" in result.stderr
    assert device["extra"]["peak_memory_mb"] == 9.8
    assert [t["node_type"] for t in device["extra"]["op_types"]][0] == "LceBconv2d"
    report = (converted_run / "report.md").read_text()
    assert "| LceBconv2d | 1 | 11.900 | 79.3 |" in report
    assert (converted_run / "bench_device.log").read_text() == TAB_OUTPUT
    assert list(sshd.remote_tmp.iterdir()) == []


@pytest.mark.slow
def test_a_thread_list_gives_one_device_row_per_count_and_a_scaling_plot(
    converted_run, sshd, tmp_path
):
    """The stand-in prints the documented output with its mean latency divided by the thread
    count it was given, so each row must carry the figure of its own --num_threads."""
    from support.recorded_outputs import TAB_OUTPUT

    (tmp_path / "output.txt").write_text(TAB_OUTPUT)
    stand_in = tmp_path / "lce_benchmark_model"
    stand_in.write_text(
        '#!/bin/sh\nt=1\nfor a in "$@"; do case $a in --num_threads=*) t=${a#*=};; esac; done\n'
        f'sed "s/avg=15408.2/avg=$((16000 / t))/" {tmp_path / "output.txt"}\n'
    )
    stand_in.chmod(0o755)
    args = ["--runner", "lce_benchmark_model", "--benchmark-binary", str(stand_in)]
    result = _cli(converted_run, *_device_args(sshd), *args, "--threads", "1,2,4", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["threads"] == 1  # the host rows keep the first count
    device = {b["name"]: b for b in report["backends"] if b["where"] != "host"}
    assert {name: row["latency_ms"]["mean"] for name, row in device.items()} == {
        "lce": 16.0,
        "lce (2 threads)": 8.0,
        "lce (4 threads)": 4.0,
    }
    assert [device[n]["extra"]["threads"] for n in device] == [1, 2, 4]
    assert all(row["extra"]["peak_memory_mb"] == 9.8 for row in device.values())
    assert (converted_run / "bench_device_threads.png").is_file()
    assert "bench_device_threads.png" in (converted_run / "report.md").read_text()


@pytest.mark.parametrize("threads", ["0", "1,x", "2,2", ""])
def test_a_bad_thread_list_is_one_line_and_changes_nothing(converted_run, threads):

    before = snapshot(converted_run)
    line = _one_line_error(invoke("bench", str(converted_run), "--threads", threads))
    assert "--threads" in line
    assert snapshot(converted_run) == before


@pytest.mark.slow
def test_the_table_shows_the_devices_peak_memory(converted_run, sshd, tmp_path):
    from support.recorded_outputs import TAB_OUTPUT

    (tmp_path / "output.txt").write_text(TAB_OUTPUT)
    stand_in = tmp_path / "lce_benchmark_model"
    stand_in.write_text(f"#!/bin/sh\ncat {tmp_path / 'output.txt'}\n")
    args = ["--runner", "lce_benchmark_model", "--benchmark-binary", str(stand_in)]
    result = _cli(converted_run, *_device_args(sshd), *args)
    assert result.exit_code == 0, result.output
    table = result.stdout.splitlines()
    assert table[0].split()[-2:] == ["peak", "MB"]
    device_rows = [row.split() for row in table if sshd.destination in row.split()[1:2]]
    assert [row[-1] for row in device_rows] == ["9.8"]
    host_rows = [row.split() for row in table if row.split()[1:2] == ["host"]]
    assert host_rows and all(row[-1] == "-" for row in host_rows)


def _tool_printing(tmp_path, text: str):
    """A shell stand-in for lce_benchmark_model on the local sshd device that prints `text`."""
    (tmp_path / "output.txt").write_text(text)
    stand_in = tmp_path / "lce_benchmark_model"
    stand_in.write_text(f"#!/bin/sh\ncat {tmp_path / 'output.txt'}\n")
    return ["--runner", "lce_benchmark_model", "--benchmark-binary", str(stand_in)]


@pytest.mark.slow
@needs_real
def test_profile_names_the_devices_time_by_pytorch_layer(converted_run, sshd, tmp_path):
    """The real tool's recorded profile of the demo's mnist-bnn flatbuffer, on this run's
    mnist-bnn flatbuffer converted as that one was, with NCHW input (the same 11 ops, the input's
    TRANSPOSE among them): every row lands on an mnist-bnn module."""
    converted = invoke("convert", converted_run, "--target", "arm64", "--input-layout", "nchw")
    assert converted.exit_code == 0, converted.output
    real = (REAL / "profile_mnist_bnn.txt").read_text()
    args = _tool_printing(tmp_path, real)
    result = _cli(converted_run, *_device_args(sshd), *args, "--profile", "--json")
    assert result.exit_code == 0, result.output
    profile = json.loads(result.stdout)["profile"]
    layers = {t["layer"]: t for t in profile["layers"]}
    modules = {name for name, _ in load_model(converted_run).named_modules()} | {"(input)"}
    assert set(layers) <= modules, sorted(layers)
    assert profile["notes"] == []
    assert sum(t["share"] for t in profile["layers"]) == pytest.approx(1.0)
    assert sorted(i for t in profile["layers"] for i in t["ops"]) == list(range(11))
    # binary layers: the rows LCE ran itself (3 LceBconv2d, 2 LceQuantize, 1 LceBMaxPool2d)
    assert profile["binary_share"] == pytest.approx(0.79435, abs=2e-4)
    slowest = profile["layers"][0]
    assert slowest["binary"] and "LceBconv2d" in slowest["op_types"]
    assert slowest["ms"] == pytest.approx(7.639 + 0.01, abs=0.03)  # its bconv (+ fused pool)
    stem = next(t for t in profile["layers"] if "Convolution (NHWC, F32) IGEMM" in t["op_types"])
    assert not stem["binary"] and stem["layer"] == "features.0"
    report = (converted_run / "report.md").read_text()
    assert "## Time by PyTorch layer on" in report and f"| {slowest['layer']} |" in report
    assert (converted_run / "bench_device_layers.png").is_file()
    assert "bench_device_layers.png" in report
    table = _cli(converted_run, *_device_args(sshd), *args, "--profile")
    assert table.exit_code == 0, table.output
    summary = [line for line in table.stdout.splitlines() if line.startswith("device profile:")]
    assert len(summary) == 1 and "binary layers 79 % of device time" in summary[0]


@pytest.mark.slow
def test_a_missing_profile_is_one_note_not_an_error(converted_run, sshd, tmp_path):
    from support.recorded_outputs import TAB_OUTPUT

    latency_only = TAB_OUTPUT.split("Operator-wise Profiling Info")[0]
    args = _tool_printing(tmp_path, latency_only)
    result = _cli(converted_run, *_device_args(sshd), *args, "--profile", "--json")
    assert result.exit_code == 0, result.output
    profile = json.loads(result.stdout)["profile"]
    assert profile["layers"] == [] and profile["notes"] == [
        "lce_benchmark_model printed no op profile table"
    ]
    assert result.stderr.count("note: profile:") == 1


@needs_real
def test_the_stand_in_prints_the_real_tools_profile_format(_converted_template, tmp_path):
    """The stand-in (tests/support/) on a real flatbuffer: its table headers are the real
    tool's, its rows have the real rows' column widths, and bnnexport maps every row to an op."""
    import dataclasses
    import subprocess

    from bnnexport.converters.flatbuffer import flatbuffer_ops
    from bnnexport.deploy.runners.lce_benchmark_model.benchmark_tool import parse_benchmark_output

    from bnnexport.stages.bench.profile import row_ops

    flatbuffer = _converted_template / "model-arm64.tflite"
    stand_in = Path(__file__).parents[1] / "support" / "lce_benchmark_model_standin.py"
    argv = [sys.executable, str(stand_in), f"--graph={flatbuffer}", "--num_runs=3",
            "--enable_op_profiling=true"]  # fmt: skip
    printed = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    real = (REAL / "profile_mnist_bnn.txt").read_text()

    def shape(text: str) -> tuple[set[str], set[tuple[int, ...]]]:
        lines = [line for line in text.splitlines() if line.startswith("\t")]
        headers = {line for line in lines if "[" in line.split("\t")[1]}
        widths = {tuple(len(f) for f in line.split("\t")[1:-1]) for line in lines
                  if line not in headers and line.count("\t") == 8}  # fmt: skip
        return headers, widths

    assert shape(printed) == shape(real)
    result = parse_benchmark_output(printed)
    ops = flatbuffer_ops(flatbuffer)
    assert result.nodes_executed == len(result.ops) == len(ops)
    rows = [dataclasses.asdict(o) for o in result.ops]
    assert row_ops(rows, [op.op_type for op in ops]) == (list(range(len(ops))), [])


@pytest.mark.parametrize(
    "args",
    [["--profile"], ["--profile", "--device", "pi@nowhere.invalid", "--runner", "python"]],
    ids=["no-device", "python-runner"],
)
def test_a_bad_profile_combination_is_one_line_and_changes_nothing(converted_run, args):

    before = snapshot(converted_run)
    line = _one_line_error(invoke("bench", str(converted_run), *args))
    assert "--profile" in line
    assert snapshot(converted_run) == before


def test_report_md_names_the_thread_count_of_each_device_op_profile(tmp_path):
    """One device row per thread count, each with its op profile: one heading each."""
    from types import SimpleNamespace

    from bnnexport.stages.bench.report_md import render_markdown
    from bnnexport.stages.bench.scoring import BackendResult

    profile = [{"node_type": "LceBconv2d", "count": 1, "avg_ms": 1.0, "percent": 80.0}]
    rows = [
        BackendResult(name, "pi@board", None, None, 0, None, None, None, None, {},
                      {"op_types": profile, "threads": threads, "runner": "lce_benchmark_model"})
        for name, threads in (("lce", 1), ("lce (4 threads)", 4))
    ]  # fmt: skip
    report = SimpleNamespace(run_dir="run", samples=0, runs=1, threads=1, backends=rows,
                             files={}, host={}, device=None)  # fmt: skip
    headings = [line for line in render_markdown(report, [], tmp_path).splitlines()
                if line.startswith("## Op profile")]  # fmt: skip
    assert headings == [
        "## Op profile on pi@board, 1 thread (lce_benchmark_model)",
        "## Op profile on pi@board, 4 threads (lce_benchmark_model)",
    ]
