"""Your own model, stage after stage: hand-written BNNs in papers' style (tests/support/
own_models.py, handwritten_bnn.py; nothing from bnnexport) through train, summary, verify, pack,
export, convert, bench and pipeline, every stage counting the same binary parameters, the ones
the model's record of binary kernels lists. A model the exporter refuses trains, verifies and
packs, and export says in one line what it refused; a model that cannot take the data, or a
loader that declares a wrong shape, is one line before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from support import own_models
from support.cli import COMMAND, run_in_process
from support.guarantees import assert_one_line_error, besides_epoch_lines
from support.handwritten_bnn import hand_written_bnn

from bnnexport.nn.discover import find_binary_kernels

FAST = ["--epochs", "1", "--batch-size", "500", "--init-sign"]
BENCH = ["--samples", "100", "--runs", "3", "--warmup", "1"]
MNIST = torch.zeros(1, 1, 28, 28)


def cli_json(*args) -> dict:
    result = run_in_process(*map(str, args), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_stops_with_one_line(result, code: int, *fragments: str) -> None:
    """Like `assert_one_line_error`, for `pipeline`, which names each stage as it starts (and
    trains, one line per epoch)."""
    lines = besides_epoch_lines(result.stderr)
    kept = "\n".join(line for line in lines if not line.startswith("["))
    result = type(result)(result.args, result.returncode, result.stdout, kept)
    assert_one_line_error(result, code, *fragments)


def recorded(factory) -> int:
    """The binary parameters the one discovery finds in a fresh model: what every stage must
    count."""
    return find_binary_kernels(factory(), MNIST).parameters


@pytest.mark.slow
def test_a_hand_written_bnn_command_by_command_counts_the_same_binary_parameters(tmp_path):
    run = tmp_path / "run"
    expected = recorded(hand_written_bnn)
    model = "support.handwritten_bnn:hand_written_bnn"
    counts = {"train": cli_json("train", "--model", model, *FAST, "--out", run)}
    for stage in ("summary", "verify", "pack"):
        counts[stage] = cli_json(stage, run)
    counts["export"] = cli_json("export", run, "--samples", 100)
    counts["convert"] = cli_json("convert", run, "--target", "arm64")
    counts["bench"] = cli_json("bench", run, *BENCH)
    assert {
        stage: report["binary_parameters"] for stage, report in counts.items()
    } == dict.fromkeys(counts, expected)
    assert counts["convert"]["lce_bconv2d"] == 3 and counts["convert"]["argmax_agreement"] == 1.0
    packed = cli_json("verify", run / "model.safetensors")  # the record travels in the file
    assert packed["strict"] and packed["binary_parameters"] == expected


def pipeline_counts(factory: str, run: Path, *options: str) -> tuple[dict, dict]:
    """(the pipeline's report, each stage's count of binary parameters, summary's included)."""
    model = f"support.own_models:{factory}"
    report = cli_json("pipeline", "--model", model, *FAST, *options, *BENCH, "--out", run)
    counts = {name: stage.get("binary_parameters") for name, stage in report["stages"].items()}
    counts["summary"] = cli_json("summary", run)["binary_parameters"]
    return report, counts


STAGES = ["train", "verify", "pack", "export", "convert", "bench", "summary"]


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["latent_detach_bnn", "plus_minus_one_bnn"])
def test_pipeline_takes_a_papers_style_bnn_all_the_way_with_one_count(factory, tmp_path):
    report, counts = pipeline_counts(factory, tmp_path / factory)
    assert counts == dict.fromkeys(STAGES, recorded(getattr(own_models, factory)))
    convert = report["stages"]["convert"]
    assert convert["lce_bconv2d"] == len(own_models.KERNELS[factory])
    assert convert["argmax_agreement"] == 1.0 and convert["torch_argmax_agreement"] == 1.0


@pytest.fixture(scope="module")
def own_int8_run(tmp_path_factory) -> tuple[Path, dict, dict]:
    """A papers-style BNN (its own STE, no Quantizer module) through `pipeline` with its float
    layers trained in int8."""
    run = tmp_path_factory.mktemp("own-int8") / "run"
    return (run, *pipeline_counts("latent_detach_bnn", run, "--float-layers", "int8"))


@pytest.mark.slow
def test_pipeline_takes_a_papers_style_bnn_with_int8_float_layers_with_one_count(own_int8_run):
    run, report, counts = own_int8_run
    assert counts == dict.fromkeys(STAGES, recorded(own_models.latent_detach_bnn))
    convert = report["stages"]["convert"]
    assert convert["lce_bconv2d"] == len(own_models.KERNELS["latent_detach_bnn"])
    assert convert["float_layers"] == "int8" and convert["int8"]["ranges"] == "trained"
    assert convert["int8"]["int8_ops"] > 0 and convert["int8"]["float_ops"] == 0
    assert json.loads((run / "config.json").read_text())["float_layers"] == "int8"


@pytest.mark.slow
def test_the_int8_export_gate_of_your_own_model_refuses_a_flipped_binary_kernel(own_int8_run):
    """No signs to replay in a model of your own: the gate still imposes ONNX Runtime's int8
    activations and refuses at the first one a wrong binary kernel changed."""
    import onnx
    from bnnexport.converters.errors import ConversionMismatchError
    from onnx import numpy_helper

    from bnnexport.run.checkpoint import open_run_model
    from bnnexport.stages.export import onnx_gate, torch_outputs

    run = own_int8_run[0]
    exported = onnx.load(run / "model.onnx")
    kernel = next(i for i in exported.graph.initializer if i.name == "blocks.1.weight")
    flipped = numpy_helper.to_array(kernel).copy()
    flipped[0] = -flipped[0]  # one output channel's signs: what a translator slip would do
    kernel.CopyFrom(numpy_helper.from_array(flipped, kernel.name))
    onnx.save(exported, run.parent / "flipped.onnx")
    model = open_run_model(run).model.eval()
    with np.load(run / "samples.npz") as samples:
        inputs = samples["inputs"][:20]
    reference = torch_outputs(model, inputs)
    onnx_gate(model, run / "model.onnx", inputs, reference)  # the real export passes
    with pytest.raises(ConversionMismatchError, match="int8 tensor '/int8_input/"):
        onnx_gate(model, run.parent / "flipped.onnx", inputs, reference)


@pytest.mark.slow
def test_the_emulated_device_computes_your_own_int8_model_as_lce_does(own_int8_run):
    """What `bench --device` runs on the emulated device (tests/support/lce_reference.py) takes
    a papers-style model's int8 flatbuffer (its STE's leftovers: SUB, MUL, ADD, MEAN) and
    computes what LCE's host interpreter computes."""
    from bnnexport.converters.flatbuffer import input_layout, to_input_layout
    from bnnexport.converters.runtimes import run_lce
    from support import lce_reference

    flatbuffer = own_int8_run[0] / "model-arm64-int8.tflite"
    with np.load(own_int8_run[0] / "samples.npz") as samples:
        inputs = samples["inputs"][:50]
    fed = to_input_layout(inputs, input_layout(flatbuffer))  # as bench feeds the device
    ours, theirs = lce_reference.load(flatbuffer).run(fed), run_lce(flatbuffer, inputs)
    assert np.array_equal(ours.argmax(1), theirs.argmax(1))
    assert np.abs(ours - theirs).max() <= lce_reference.int8_output_step(flatbuffer) * 1.001


@pytest.mark.slow
def test_a_model_the_exporter_refuses_trains_verifies_packs_and_export_says_why(tmp_path):
    run = tmp_path / "run"
    expected = recorded(own_models.unexportable_bnn)
    model = "support.own_models:unexportable_bnn"
    counts = {"train": cli_json("train", "--model", model, *FAST, "--out", run)}
    for stage in ("summary", "verify", "pack"):
        counts[stage] = cli_json(stage, run)
    assert {s: r["binary_parameters"] for s, r in counts.items()} == dict.fromkeys(counts, expected)
    refused = run_in_process("export", run)
    assert_one_line_error(refused, 2, "cannot export UnexportableBNN")
    assert "adaptive_avg_pool2d" in refused.stderr and refused.stdout == ""
    assert not (run / "model.onnx").exists() and not (run / "samples.npz").exists()
    stopped = run_in_process("pipeline", "--model", model, *FAST, "--out", tmp_path / "p")
    assert_stops_with_one_line(stopped, 2, "adaptive_avg_pool2d")
    assert "[4/6] export" in stopped.stderr


@pytest.mark.parametrize("command", ["train", "pipeline", "sweep"])
def test_a_model_that_cannot_take_the_data_is_one_line_before_training(command, tmp_path):
    out = tmp_path / "run"
    args = ["--model", "support.own_models:three_channel_bnn", "--out", out]
    if command == "sweep":
        args += ["--gamma", "1e-3", "--threshold", "1e-6"]
    result = run_in_process(command, *args)
    assert_stops_with_one_line(result, 2, "cannot take --dataset mnist5k's input 1x28x28")
    assert "to have 3 channels" in result.stderr
    assert not out.exists()


def test_a_loader_that_declares_the_wrong_input_shape_is_one_line(tmp_path):
    result = run_in_process("train", "--dataset", "support.own_models:mislabelled_mnist",
                            "--out", tmp_path / "run")  # fmt: skip
    assert_one_line_error(result, 2, "declares input_shape [3, 32, 32]")
    assert "first train sample has shape [1, 28, 28]" in result.stderr
    assert not (tmp_path / "run").exists()


def test_init_takes_your_own_factory_and_every_stage_reads_its_record(tmp_path):
    run = tmp_path / "run"
    expected = recorded(own_models.latent_detach_bnn)
    init = cli_json("init", "--model", "support.own_models:latent_detach_bnn", "--out", run)
    counts = {stage: cli_json(stage, run)["binary_parameters"] for stage in ("verify", "pack")}
    counts.update(
        init=init["binary_parameters"], summary=cli_json("summary", run)["binary_parameters"]
    )
    assert counts == dict.fromkeys(counts, expected) and init["binary_layers"] == 2
    assert init["input_shape"] == [1, 28, 28] and init["num_classes"] == 10  # the factory's own


@pytest.mark.slow
def test_convert_refuses_a_graph_that_lost_binary_layers_the_record_lists(tmp_path):
    """With the pass that reads the detach trick switched off, the ONNX graph shows no binary
    layer: without the record, both layers would have converted float, silently."""
    run = tmp_path / "run"
    cli_json("init", "--model", "support.own_models:latent_detach_bnn", "--out", run)
    cli_json("export", run, "--samples", 20)
    result = run_in_process("convert", run, "--disable-rewrite", "ste-detach")
    line = assert_one_line_error(result, 1, "the model's record lists 2 binary layers, the ONNX "
                                 "graph shows 0")  # fmt: skip
    for k in (0, 1):  # each lost layer by its node, kernel, module and where its input comes from
        assert (f"/blocks/blocks.{k}/Conv: kernel blocks.{k}.weight (conv2d in module "
                f"'blocks.{k}') is binary in the record, float in the graph") in line  # fmt: skip
        assert f"its input comes from Add node '/blocks/blocks.{k}/Add_1'" in line
    assert not (run / "model-arm64.tflite").exists()


@pytest.mark.slow
def test_init_sign_says_what_it_set_in_one_warning_line(tmp_path):
    """In a process of its own: pytest would catch the warning before it is printed."""
    tests = Path(__file__).resolve().parents[1]
    args = ["--model", "support.handwritten_bnn:hand_written_bnn", *FAST, "--out", tmp_path / "r"]
    env = {**os.environ, "PYTHONPATH": str(tests)}
    result = subprocess.run([*COMMAND, "train", *map(str, args)], capture_output=True,
                            text=True, env=env, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "init_sign" in line]
    assert said == [
        "bnnexport: warning: init_sign: set 3 binary kernel(s) to sign(w), ties to +1: w1, w2, fc"
    ]
    assert "return OPTIMIZERS" not in result.stderr  # no source line under it
