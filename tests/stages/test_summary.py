"""bnnexport summary: every layer PyTorch runs, a forward of your own included, sized from the
shapes one forward pass sees; binary weights as the run's record of binary kernels lists them."""

from __future__ import annotations

import json

import torch
from support import own_models
from support.cli import run_in_process
from support.handwritten_bnn import hand_written_bnn

from bnnexport.models import create_model
from bnnexport.nn.discover import find_binary_kernels
from bnnexport.stages.summary import summarize


def rows(report) -> dict:
    return {layer.name: layer for layer in report.layers}


def test_a_forward_of_your_own_is_counted_layer_by_layer():
    model = hand_written_bnn()
    report = summarize(model, (1, 28, 28))
    layers = rows(report)
    # F.conv2d(ste(x), ste(self.w1)) on a 14x14 map: 16 outputs x 16 inputs x 3x3 per pixel
    assert (layers["w1"].kind, layers["w1"].macs) == ("conv2d", 16 * 14 * 14 * 16 * 9)
    assert (layers["w2"].macs, layers["fc"].macs) == (16 * 7 * 7 * 16 * 9, 10 * 16 * 7 * 7)
    assert all(layers[k].input_bits == layers[k].weight_bits == 1 for k in ("w1", "w2", "fc"))
    assert (layers["stem"].input_bits, layers["stem"].macs) == (32, 16 * 28 * 28 * 9)
    assert report.binary_macs == sum(layers[k].macs for k in ("w1", "w2", "fc"))
    assert report.float_macs == layers["stem"].macs
    assert (
        report.binary_parameters == find_binary_kernels(model, torch.zeros(1, 1, 28, 28)).parameters
    )
    assert report.binary_parameters + report.float_parameters == sum(
        p.numel() for p in model.parameters()
    )
    assert report.packed_bytes < report.float32_bytes / 10


def test_a_matmul_head_and_a_learned_scale_are_layers_and_parameters_too():
    model = own_models.plus_minus_one_bnn()
    layers = rows(summarize(model, (1, 28, 28)))
    assert (layers["fc"].kind, layers["fc"].macs, layers["fc"].input_bits) == (
        "matmul",
        10 * 1568,
        1,
    )
    assert layers["gamma1"].float_parameters == 32 and layers["gamma1"].macs == 0


def test_a_zoo_model_keeps_its_layer_names_and_counts():
    report = summarize(create_model("mnist-bnn"))
    layers = rows(report)
    assert [n for n, layer in layers.items() if layer.weight_bits == 1] == [
        "features.2",
        "features.5",
        "classifier.1",
    ]
    assert layers["features.2"].kind == "BinaryConv2d" and layers["features.1"].macs == 0
    assert report.binary_parameters == 456704


def test_the_cli_reads_the_runs_record(trained_run):
    summary = json.loads(run_in_process("summary", trained_run, "--json").stdout)
    verify = json.loads(run_in_process("verify", trained_run, "--json").stdout)
    assert summary["binary_parameters"] == verify["binary_parameters"] == 456704
    assert summary["binary_kernels"] == "tracing"
    table = run_in_process("summary", trained_run).stdout
    assert "binary parameters   456,704 (kernels tracing)" in table
