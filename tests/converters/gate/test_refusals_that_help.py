"""A refusal names the first offending ONNX node, the PyTorch module, the cause and a fix that
fits, and the fix it suggests converts: a binary transposed conv, a reflect or replicate
padding before a binary conv, a channel permutation by Gather, and a model whose own record
lists binary layers the graph lost (`converters.gate.fallbacks`,
`converters.translate.coverage`)."""

from __future__ import annotations

import re

import pytest
import torch
from bnnexport.converters.errors import FloatFallbackError
from bnnexport.converters.lce import ConvertOptions, convert_onnx
from support.cli import invoke
from support.converter_nets import convert_net, export, grid_inputs, snap_to_grid
from support.guarantees import assert_one_line_error
from support.refused_models import SHUFFLE, SWAP, Padded, Permuting, Rounded, Upsampling

from bnnexport import convert_module

SHAPE = (1, 1, 8, 8)


@pytest.fixture
def onnx_of(tmp_path):
    def export_it(net):
        torch.manual_seed(0)
        return export(net, SHAPE, tmp_path / "mine.onnx")

    return export_it


def _assert_binary(result, versus_torch, layers):
    assert result.lce_bconv2d == result.binary_layers == layers, result.op_histogram
    assert versus_torch.argmax_agreement == 1.0
    assert versus_torch.max_abs_diff <= 1e-4 * max(versus_torch.logit_range, 1.0)


def test_a_binary_transposed_conv_is_refused_by_name(onnx_of):
    line = assert_one_line_error(invoke("convert", onnx_of(Upsampling())), 1)
    assert "/up/ConvTranspose: a binary transposed convolution" in line
    assert "LCE has no binary transposed conv" in line and "pixel shuffle" in line
    assert "--allow-float" in line


@pytest.mark.slow
def test_allow_float_keeps_a_binary_transposed_conv_float(tmp_path):
    torch.manual_seed(0)
    path = export(snap_to_grid(Upsampling()), SHAPE, tmp_path / "mine.onnx")
    options = ConvertOptions(allow_float=("/up/ConvTranspose",))
    result = convert_onnx(path, tmp_path / "mine.tflite", inputs=grid_inputs(16, SHAPE),
                          options=options)  # fmt: skip
    assert result.float_fallbacks == ["/up/ConvTranspose"]
    assert result.lce_bconv2d == 1 and result.op_histogram.get("TRANSPOSE_CONV") == 1


@pytest.mark.slow
def test_the_pixel_shuffle_the_refusal_suggests_keeps_the_upsampling_binary(tmp_path):
    torch.manual_seed(0)
    _assert_binary(*convert_net(Upsampling(subpixel=True), SHAPE, tmp_path), layers=2)


@pytest.mark.parametrize(("mode", "onnx_mode"), [("reflect", "reflect"), ("replicate", "edge")])
def test_a_reflect_or_replicate_padding_names_the_pad_its_mode_and_what_lce_pads_with(
    onnx_of, mode, onnx_mode
):
    line = assert_one_line_error(invoke("convert", onnx_of(Padded(mode))), 1)
    assert f"/b2/Conv: Pad node '/b2/Pad' pads its binarized input in {onnx_mode} mode" in line
    assert f"padding_mode={mode!r}" in line and "(1, 1, 1, 1)" in line
    assert "only with a constant: 0 (torch's padding_mode='zeros') or +1" in line
    assert "pad before the sign instead" in line


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_padding_before_the_sign_as_the_refusal_suggests_converts(tmp_path, mode):
    torch.manual_seed(0)
    _assert_binary(*convert_net(Padded(mode, pad_first=True), SHAPE, tmp_path), layers=2)


def _permutation_hint(onnx_path) -> str:
    line = assert_one_line_error(invoke("convert", onnx_path), 2)
    assert "unsupported ONNX node '/shuffle/Gather' of op type Gather" in line
    assert "from PyTorch module 'shuffle'" in line
    found = re.search(r"x\[:, perm\] is (.+?), which converts", line)
    assert found is not None, line
    return found.group(1)


@pytest.mark.parametrize(
    ("perm", "expected"),
    [
        (SHUFFLE, "x.reshape(n, 2, 8, h, w).transpose(1, 2).reshape(n, 16, h, w)"),
        (SWAP, "torch.cat([x[:, 8:16], x[:, 0:8]], 1)"),
    ],
    ids=["shuffle", "swap"],
)
def test_a_channel_permutation_by_gather_is_spelled_in_ops_that_convert(onnx_of, perm, expected):
    spelled = _permutation_hint(onnx_of(Permuting(perm)))
    assert spelled == expected
    x = torch.randn(2, 16, 3, 5)
    n, c, h, w = x.shape
    assert torch.equal(
        eval(spelled, {"torch": torch}, {"x": x, "n": n, "h": h, "w": w}), x[:, perm]
    )


@pytest.mark.slow
@pytest.mark.parametrize("perm", [SHUFFLE, SWAP], ids=["shuffle", "swap"])
def test_the_spelled_permutation_converts_binary(onnx_of, tmp_path, perm):
    spelled = _permutation_hint(onnx_of(Permuting(perm)))
    (tmp_path / "spelled").mkdir()
    torch.manual_seed(0)
    _assert_binary(*convert_net(Permuting(perm, spelled), SHAPE, tmp_path / "spelled"), layers=2)


def _record_refusal(net, tmp_path) -> str:
    """convert_module's refusal of `net`: the model's own record lists its binary layers."""
    torch.manual_seed(0)
    with pytest.raises(FloatFallbackError) as refused:
        convert_module(net.eval(), torch.randn(*SHAPE), out=tmp_path / "mine.tflite")
    return str(refused.value)


def test_the_record_names_each_binary_layer_the_graph_lost(tmp_path):
    line = _record_refusal(Padded("reflect"), tmp_path)
    assert line.startswith("1 binary layer(s) would stay float: /b2/Conv: kernel b2.weight ")
    assert "(conv2d in module 'b2') is binary in the record, float in the graph" in line
    assert "the model's record lists 2 binary layers, the ONNX graph shows 1" in line
    assert "Pad node '/b2/Pad' pads its binarized input in reflect mode" in line


def test_a_binarization_the_normaliser_does_not_know_is_named_by_its_node(tmp_path):
    line = _record_refusal(Rounded(), tmp_path)
    assert "/b2/Conv: kernel b2.weight (conv2d in module 'b2') is binary in the record" in line
    assert "its input comes from Round node '/b2/Round'" in line
    assert "form the normaliser does not recognise" in line


def test_a_binary_transposed_conv_is_in_the_record_and_refused_by_it(tmp_path):
    line = _record_refusal(Upsampling(), tmp_path)
    assert "/up/ConvTranspose: kernel up.weight (conv_transpose2d in module 'up')" in line
    assert "LCE has no binary transposed conv" in line
