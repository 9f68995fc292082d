"""bnnexport.convert_module: any nn.Module -> ONNX (the user's exporter) -> the convert path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.client_nets import index_put

from bnnexport import convert_module
from bnnexport.errors import FidelityError


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_dynamo_exporter_converts_a_plain_torch_bnn(tmp_path):
    report = convert_module(index_put(), torch.randn(1, 3, 16, 16), out=tmp_path / "n.tflite",
                            exporter="dynamo")  # fmt: skip
    assert report.lce_bconv2d == report.binary_layers == 2
    assert report.rewrites["index-put"] == 4 and report.zero_free_signs == []
    assert report.argmax_agreement == 1.0 and report.torch_argmax_agreement == 1.0
    assert (tmp_path / "n.onnx").is_file() and (tmp_path / "n.tflite").is_file()
    # the target's input layout: NHWC, no TRANSPOSE at the input
    assert (report.input_layout, report.input_shape) == ("nhwc", [1, 16, 16, 3])
    assert "TRANSPOSE" not in report.op_histogram


@pytest.mark.slow
def test_a_float_module_counts_zero_binary_parameters_its_tracing_decided(tmp_path):
    # a record that says "none" (0), not a missing record (None: an ONNX file of unknown origin)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten())
    report = convert_module(net, torch.randn(1, 3, 8, 8), out=tmp_path / "f.tflite", samples=4)
    assert report.binary_parameters == 0 and report.binary_layers == report.lce_bconv2d == 0


@pytest.mark.slow
def test_input_layout_nchw_keeps_the_modules_own_input_one_flag_away(tmp_path):
    from bnnexport.converters.flatbuffer import input_layout

    report = convert_module(index_put(), torch.randn(1, 3, 16, 16), out=tmp_path / "n.tflite",
                            input_layout="nchw", samples=4)  # fmt: skip
    assert (report.input_layout, report.input_shape) == ("nchw", [1, 3, 16, 16])
    assert report.op_histogram["TRANSPOSE"] == 1 and report.argmax_agreement == 1.0
    assert input_layout(tmp_path / "n.tflite") == "nchw"


def test_an_unknown_input_layout_is_refused_before_exporting(tmp_path):
    with pytest.raises(ValueError, match="input_layout must be nhwc, nchw or None, got 'hwc'"):
        convert_module(index_put(), torch.randn(1, 3, 16, 16), out=tmp_path / "n.tflite",
                       input_layout="hwc")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_exporter_is_refused_before_exporting(tmp_path):
    with pytest.raises(ValueError, match="exporter must be one of legacy, dynamo"):
        convert_module(index_put(), torch.randn(1, 3, 16, 16), out=tmp_path / "n.tflite",
                       exporter="onnx2")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_gate_runs_on_the_users_own_samples_and_says_they_were_not_random(
    tmp_path, monkeypatch
):
    import bnnexport.converters.lce
    import numpy as np

    seen = {}
    real = bnnexport.converters.lce.convert_onnx

    def spy(*args, **kwargs):
        seen["inputs"] = kwargs["inputs"]
        return real(*args, **kwargs)

    monkeypatch.setattr(bnnexport.converters.lce, "convert_onnx", spy)
    mine = torch.rand(5, 3, 16, 16) * 2 - 1  # e.g. images in [-1, 1]
    report = convert_module(index_put(), torch.randn(1, 3, 16, 16), out=tmp_path / "n.tflite",
                            samples=mine)  # fmt: skip
    np.testing.assert_array_equal(seen["inputs"], mine.numpy())
    assert report.samples == 5 and report.random_inputs is False
    report = convert_module(index_put(), torch.randn(1, 3, 16, 16), out=tmp_path / "n.tflite",
                            samples=3)  # fmt: skip
    assert report.samples == 3 and report.random_inputs is True


def test_samples_of_another_shape_are_refused_in_one_line(tmp_path):
    from bnnexport.errors import DataError

    with pytest.raises(DataError, match=r"samples of shape \[2, 3, 8, 8\] do not fit"):
        convert_module(index_put(), torch.randn(1, 3, 16, 16), out=tmp_path / "n.tflite",
                       samples=torch.zeros(2, 3, 8, 8))  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def _fresh_mnist_bnn():
    """mnist-bnn as `create_model` builds it: BatchNorm with its default statistics, so the
    folded ±1 kernels' integer sums of 0 come out of each runtime as its own rounding."""
    from bnnexport import create_model

    torch.manual_seed(0)
    return create_model("mnist-bnn").eval(), torch.zeros(1, 1, 28, 28)


def test_a_fresh_model_is_refused_as_degenerate_saying_where_and_what_to_do(tmp_path):
    import json

    from bnnexport.errors import FidelityError

    model, example = _fresh_mnist_bnn()
    with pytest.raises(FidelityError) as refused:
        convert_module(model, example, out=tmp_path / "m.tflite")
    line = str(refused.value)
    assert refused.value.exit_code == 1 and "\n" not in line
    assert "cannot be decided on real weights" in line and "within rounding of zero" in line
    assert "'/features/features.4/MaxPool_output_0'" in line and "on sample 0" in line
    assert "BatchNorm with its default statistics" in line and "train it first" in line
    assert "randomise BatchNorm as `bnnexport init` does" in line and "trust_twin" in line
    assert "exporter" not in line  # the export is not to blame
    details = json.loads((tmp_path / "m-gate-refusal.json").read_text())
    assert str(tmp_path / "m-gate-refusal.json") in line
    assert details["near_zero"][0]["near_zero"] > details["near_zero"][0]["tie_bound"]
    assert not (tmp_path / "m.tflite").exists()


@pytest.mark.long  # a conversion and its twin: ~50 s on a loaded machine
def test_trust_twin_converts_a_degenerate_model_and_says_so(tmp_path):
    model, example = _fresh_mnist_bnn()
    with pytest.warns(UserWarning, match="exact-grid twin alone"):
        report = convert_module(model, example, out=tmp_path / "m.tflite", trust_twin=True)
    assert report.trusted_twin is not None
    assert "cannot be decided on real weights" in report.trusted_twin["inconclusive"]
    assert report.lce_bconv2d == report.binary_layers == 3
    assert report.twin_checks and all(c["max_abs_diff"] <= c["tolerance"] for c in
                                      report.twin_checks)  # fmt: skip


@pytest.mark.parametrize("moved, refused", [(1, False), (2, True)])
def test_a_module_pytorch_cannot_be_probed_on_allows_one_changed_prediction_at_export(
    tmp_path, monkeypatch, moved, refused
):
    """Where a module's binarizations cannot be traced (here the trace is made to fail), no
    replay can explain a tie: the export check judges predictions only, one may change (a
    rounding tie); two are refused before any conversion, naming the count and why."""
    from bnnexport.converters.gate.probe import OnnxProbe

    samples = np.random.default_rng(0).standard_normal((16, 3, 16, 16)).astype(np.float32)
    real_run = OnnxProbe.run

    def swapped(self, x, imposed=None):
        logits, values = real_run(self, x, imposed)
        if any(np.array_equal(x, samples[row]) for row in range(moved)):
            logits = logits.copy()
            logits[int(logits.argmax())] = logits.min() - 1.0  # another class wins
        return logits, values

    def untraceable(*_args, **_kwargs):
        raise RuntimeError("an op the trace cannot see")

    monkeypatch.setattr(OnnxProbe, "run", swapped)
    monkeypatch.setattr("bnnexport.stages.torch_probe.trace_binarizations", untraceable)
    convert = lambda: convert_module(index_put(), torch.randn(1, 3, 16, 16),  # noqa: E731
                                     out=tmp_path / "n.tflite", samples=samples)  # fmt: skip
    if not refused:
        assert convert().lce_bconv2d == 2
        return
    with pytest.raises(FidelityError, match="2 predictions differ; without a replay") as e:
        convert()
    assert "cannot be replayed: tracing its forward pass failed: an op the trace" in str(e.value)
    assert not (tmp_path / "n.tflite").exists()


class _Ste(torch.autograd.Function):
    """A user's own straight-through sign, sign(0) = +1: no bnnexport Quantizer to probe."""

    @staticmethod
    def forward(ctx, x):
        return torch.where(x >= 0, 1.0, -1.0)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _FreshOwnBnn(torch.nn.Module):
    """Hand-written: float stem, two ±1 convs, BatchNorms with their default statistics."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = torch.nn.Conv2d(1, 32, 3, padding=1)
        self.conv1, self.conv2 = (torch.nn.Conv2d(32, 32, 3, padding=1, bias=False) for _ in "ab")
        with torch.no_grad():
            for conv in (self.conv1, self.conv2):
                conv.weight.copy_(torch.where(torch.randn_like(conv.weight) >= 0, 1.0, -1.0))
        self.bn1, self.bn2 = torch.nn.BatchNorm2d(32), torch.nn.BatchNorm2d(32)
        self.fc = torch.nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = self.bn1(self.conv1(_Ste.apply(self.stem(x))))
        x = self.bn2(self.conv2(_Ste.apply(x)))
        return self.fc(x.flatten(1))


def test_a_fresh_module_of_your_own_is_refused_as_degenerate_not_blamed_on_the_exporter(tmp_path):
    """No replay can probe a module whose binarizations are its own functions, so its export is
    judged on predictions (`unprobed_flips`); when that fails on a model whose BatchNorms still
    have their default statistics, the line says the check cannot be decided, and why."""
    from bnnexport.errors import FidelityError

    samples = torch.randn(32, 1, 8, 8)
    with pytest.raises(FidelityError) as refused:
        convert_module(_FreshOwnBnn().eval(), samples[:1], out=tmp_path / "m.tflite",
                       samples=samples)  # fmt: skip
    line = str(refused.value)
    assert "\n" not in line and "cannot be decided on real weights" in line, line
    assert "BatchNorm with its default statistics" in line and "trust_twin" in line
    assert not (tmp_path / "m.tflite").exists()
