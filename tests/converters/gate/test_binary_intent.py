"""A layer meant to be binary is never silently left float: a kernel binarized with sign(w)
that holds exact zeros (or a ternary kernel) is refused by `convert` and by `verify`, naming the
layer, the count and the fix; `--allow-float LAYER` keeps it float on purpose."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from support.cli import invoke
from support.converter_nets import export, sign
from support.guarantees import assert_one_line_error


class SignedWeight(nn.Module):
    """A hand-written BNN: its own weight, binarized in forward with torch's plain sign."""

    def __init__(self, zeros: int):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        weight = torch.where(torch.randn(8, 8, 3, 3) >= 0, 1.0, -1.0)
        weight.view(-1)[:zeros] = 0.0  # what a weight that sits at 0 gives: sign(0) = 0
        self.w = nn.Parameter(weight)

    def forward(self, x):
        return F.conv2d(sign(self.stem(x)), self.w.sign(), padding=1).mean((2, 3))


@pytest.mark.parametrize("zeros", [1, 200], ids=["one-zero", "ternary"])
def test_a_sign_kernel_with_exact_zeros_is_refused_by_convert_and_verify(tmp_path, zeros):
    torch.manual_seed(0)
    path = export(SignedWeight(zeros), (1, 1, 8, 8), tmp_path / "mine.onnx")
    line = assert_one_line_error(invoke("convert", str(path)), 1)
    assert "ternary" in line and f"{zeros} exact zeros of 576 values" in line
    assert "torch.where(w >= 0, 1.0, -1.0)" in line and "would stay float" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.onnx"]
    result = invoke("verify", str(path))
    assert result.exit_code == 1 and "NOT BINARY" in result.stdout
    assert "sign(w) maps 0 to 0" in result.stdout


@pytest.mark.slow
def test_allow_float_keeps_such_a_layer_float_on_purpose(tmp_path):
    torch.manual_seed(0)
    path = export(SignedWeight(1), (1, 1, 8, 8), tmp_path / "mine.onnx")
    layer = json.loads(invoke("verify", str(path), "--json").stdout)["layers"][0]["name"]
    result = invoke("convert", str(path), "--allow-float", layer, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["float_fallbacks"] == [layer] and report["lce_bconv2d"] == 0


@pytest.mark.slow
def test_the_same_model_without_zeros_is_binary_for_both(tmp_path):
    torch.manual_seed(0)
    path = export(SignedWeight(0), (1, 1, 8, 8), tmp_path / "mine.onnx")
    assert invoke("verify", str(path)).exit_code == 0
    report = json.loads(invoke("convert", str(path), "--json").stdout)
    assert report["lce_bconv2d"] == report["binary_layers"] == 1
