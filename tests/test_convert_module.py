"""bnnexport.convert_module: any nn.Module -> ONNX (the user's exporter) -> the convert path."""

from __future__ import annotations

import pytest
import torch
from client_nets import index_put

from bnnexport import convert_module


@pytest.mark.filterwarnings("ignore")
def test_dynamo_exporter_converts_a_plain_torch_bnn(tmp_path):
    report = convert_module(index_put(), torch.randn(1, 3, 16, 16), out=tmp_path / "n.tflite",
                            exporter="dynamo")  # fmt: skip
    assert report.lce_bconv2d == report.binary_layers == 2
    assert report.rewrites["index-put"] == 4 and report.zero_free_signs == []
    assert report.argmax_agreement == 1.0 and report.torch_argmax_agreement == 1.0
    assert (tmp_path / "n.onnx").is_file() and (tmp_path / "n.tflite").is_file()


def test_an_unknown_exporter_is_refused_before_exporting(tmp_path):
    with pytest.raises(ValueError, match="exporter must be one of legacy, dynamo"):
        convert_module(index_put(), torch.randn(1, 3, 16, 16), out=tmp_path / "n.tflite",
                       exporter="onnx2")  # fmt: skip
    assert list(tmp_path.iterdir()) == []
