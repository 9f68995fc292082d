"""The BinaryNet layout (Courbariaux et al.; CIFAR-10 shape), written with plain torch ops:
every binary layer, the three dense ones included, must become an LceBconv2d, the flatbuffer
must agree with PyTorch on 1000 inputs, and be at least 20x smaller than the float TFLite."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from support.cli import invoke
from support.converter_nets import binary_conv, binary_linear, export, sign, trained_bn

from bnnexport.nn.quantizers import SteSign

pytestmark = pytest.mark.slow


class BinaryNet(nn.Module):
    """convs 128-128-256-256-512-512 (3x3, no bias; the first valid 32->30 on the real-valued
    image, the others zero-padded "same"), max-pool after each pair, BatchNorm, dense
    1024-1024-10; every layer but the first reads a binarized input."""

    def __init__(self):
        super().__init__()
        widths = [128, 128, 256, 256, 512, 512]
        self.convs = nn.ModuleList()
        cin = 3
        for k, cout in enumerate(widths):
            self.convs.append(binary_conv(cin, cout, padding=0 if k == 0 else 1))
            cin = cout
        self.conv_bns = nn.ModuleList(trained_bn(nn.BatchNorm2d(w), seed=k) for k, w in
                                      enumerate(widths))  # fmt: skip
        self.dense = nn.ModuleList(
            [binary_linear(512 * 3 * 3, 1024), binary_linear(1024, 1024), binary_linear(1024, 10)]
        )
        self.dense_bns = nn.ModuleList(trained_bn(nn.BatchNorm1d(n), seed=10 + k) for k, n in
                                       enumerate((1024, 1024, 10)))  # fmt: skip

    def forward(self, x):
        for k, (conv, bn) in enumerate(zip(self.convs, self.conv_bns, strict=True)):
            x = bn(conv(x if k == 0 else sign(x)))
            if k % 2 == 1:
                x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        for fc, bn in zip(self.dense, self.dense_bns, strict=True):
            x = bn(fc(sign(x)))
        return x


@pytest.mark.long  # 1000 samples through LCE and torch: ~45 s
def test_binarynet_layout_is_fully_binary_exact_and_20x_smaller(tmp_path):
    from bnnexport.converters.gate import compare_outputs
    from bnnexport.converters.lce import convert_onnx
    from bnnexport.converters.runtimes import run_lce

    torch.manual_seed(0)
    net = BinaryNet().eval()
    path = export(net, (1, 3, 32, 32), tmp_path / "binarynet.onnx", do_constant_folding=False)
    # 8-bit images scaled to [-1, 1) in steps of 1/128: the first (float-input) conv's sums
    # are then exact in every runtime. With arbitrary real inputs, pre-activations within
    # float rounding of a BatchNorm threshold binarize differently in ONNX Runtime and PyTorch
    # too (a few samples in a thousand): that is the reference's own ambiguity, not the
    # converter's.
    pixels = np.random.default_rng(0).integers(0, 256, (1000, 3, 32, 32))
    x = (pixels / 128.0 - 1.0).astype(np.float32)
    result = convert_onnx(
        path, tmp_path / "binarynet-arm64.tflite", inputs=x,
        write_float_tflite=tmp_path / "binarynet-float.tflite",
    )  # fmt: skip
    assert result.binary_layers == 8
    assert result.lce_bconv2d == 8, result.op_histogram
    assert result.fully_connected == 0
    assert result.gate("ONNX Runtime").plain_argmax_agreement == 1.0 and result.samples == 1000
    with torch.no_grad():
        expected = torch.cat([net(torch.from_numpy(x[k : k + 250])) for k in range(0, 1000, 250)])
    versus_torch = compare_outputs(expected.numpy(), run_lce(result.output, x))
    assert versus_torch.argmax_agreement == 1.0
    assert versus_torch.max_abs_diff <= 1e-4 * versus_torch.logit_range
    assert result.tflite_float_bytes >= 20 * result.lce_bytes
    versus_onnx = result.gate("ONNX Runtime")
    assert result.twin and all(t.max_abs_diff == 0.0 for t in result.twin)  # bit-exact twin
    print(
        f"\nBinaryNet: {result.lce_bconv2d}/{result.binary_layers} LceBconv2d, LCE "
        f"{result.lce_bytes} B vs float TFLite {result.tflite_float_bytes} B "
        f"({result.tflite_float_bytes / result.lce_bytes:.1f}x), max |diff| vs ORT "
        f"{versus_onnx.plain_max_abs_diff:.3g}, vs torch {versus_torch.max_abs_diff:.3g}, "
        f"{result.seconds:.1f} s"
    )


def test_binarynet_without_the_exact_zero_tie_break_is_refused(tmp_path, monkeypatch):
    """The mutation the gate once let through (193 of 200 samples called "sign ties", real
    agreement 0.32): LCE binarizing by its own rounding the values at a BatchNorm threshold
    1.6e-6 from an integer. Each such sign alone is within rounding of zero; the same value
    decided differently on sample after sample is not a tie: exit 1, no flatbuffer, and the
    diagnostics file the line names says where (the twin, exact, passes)."""
    import json

    import bnnexport.converters.translate.values

    torch.manual_seed(0)
    path = export(BinaryNet().eval(), (1, 3, 32, 32), tmp_path / "binarynet.onnx",
                  do_constant_folding=False)  # fmt: skip
    monkeypatch.setattr(
        bnnexport.converters.translate.values, "tie_break_bias", lambda m, b: b.astype(np.float32)
    )
    result = invoke("convert", str(path))
    assert result.exit_code == 1, result.output
    assert "no flatbuffer kept" in result.stderr and len(result.stderr.splitlines()) == 1
    assert "not a rounding tie" in result.stderr, result.stderr
    assert not list(tmp_path.glob("*.tflite"))
    refusal = tmp_path / "binarynet-arm64-gate-refusal.json"
    assert str(refusal) in result.stderr
    details = json.loads(refusal.read_text())
    assert details["first_differing_binarization"] == "/conv_bns.2/BatchNormalization_output_0"
    assert details["binarizations"][0]["largest"] < 1e-5  # each alone within rounding
    assert details["twin"].startswith("passed"), details["twin"]


class QuantizedBinaryNet(BinaryNet):
    """BinaryNet binarizing through bnnexport's `SteSign` module, so PyTorch can be probed
    (`TorchProbe`) and arbitrate: the same parameters as BinaryNet for the same seed."""

    def __init__(self):
        super().__init__()
        self.binarize = SteSign()

    def forward(self, x):
        for k, (conv, bn) in enumerate(zip(self.convs, self.conv_bns, strict=True)):
            x = bn(conv(x if k == 0 else self.binarize(x)))
            if k % 2 == 1:
                x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        for fc, bn in zip(self.dense, self.dense_bns, strict=True):
            x = bn(fc(self.binarize(x)))
        return x


def test_the_tie_break_mutant_is_refused_with_pytorch_as_arbiter(tmp_path, monkeypatch):
    """The recurring value the mutant decides by its own rounding (exactly 0 in LCE, -9.1e-7
    in ONNX Runtime) is one PyTorch, the arbiter, decides as ONNX Runtime does: the candidate's
    own rule, refused, though an arbiter that split from ONNX Runtime would excuse it."""
    import bnnexport.converters.translate.values
    from bnnexport.converters.errors import ConversionMismatchError
    from bnnexport.converters.gate.checks import Reference
    from bnnexport.converters.lce import convert_onnx

    from bnnexport.stages.torch_probe import TorchProbe

    torch.manual_seed(0)
    net = QuantizedBinaryNet().eval()
    path = export(net, (1, 3, 32, 32), tmp_path / "binarynet.onnx", do_constant_folding=False)
    x = np.random.default_rng(0).standard_normal((16, 3, 32, 32)).astype(np.float32)

    def outputs(batch: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return net(torch.from_numpy(batch)).numpy()

    pytorch = Reference("PyTorch", outputs, probe=lambda: TorchProbe(net, path))
    monkeypatch.setattr(
        bnnexport.converters.translate.values, "tie_break_bias", lambda m, b: b.astype(np.float32)
    )
    with pytest.raises(ConversionMismatchError, match="no other reference decides it") as refused:
        convert_onnx(path, tmp_path / "binarynet.tflite", inputs=x, references=[pytorch])
    assert "LCE vs ONNX Runtime" in str(refused.value)
    assert not (tmp_path / "binarynet.tflite").exists()
