"""Channel slicing converts exactly, and the binary convs around it stay `LceBconv2d`s.

MeliusNet grows a dense stream and improves its last 64 channels in place: each improvement
block adds a binary conv's output to `x[:, -64:]`. PyTorch code writes that as a slice and a
concat (`x[:, :-64]`), with `torch.split`, or in place (`x[:, -64:] += y`), which the exporters
write as `Slice`, `Split` and `ScatterND` (`MeliusBlock` of `tests/support/client_nets.py`,
whose real-client rows show each normaliser pass is what makes it convert). The normaliser
writes the last two as slices and concats (`converters.normalize.slicing`), and the translator
slices in NHWC (`converters.translate.tf_elementwise.slice_`). A slice right before a binary
conv (of the binarized tensor) and right after one (of its output, before its BatchNorm) keeps
the conv binary and its ties exact.

Every model is written here in plain torch and converted with `bnnexport.convert_module` (ONNX
Runtime, the exact-grid twin, then PyTorch).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from support.client_nets import MeliusBlock
from support.converter_nets import binary_conv, sign, trained_bn

pytestmark = pytest.mark.usefixtures("seeded")  # random ±1 kernels, the same every run


def _convert(net, tmp_path, exporter="legacy"):
    from bnnexport import convert_module

    return convert_module(net, torch.randn(1, 3, 4, 4), out=tmp_path / "n.tflite",
                          exporter=exporter)  # fmt: skip


def _assert_exact(report, binary_layers: int = 2) -> None:
    assert report.binary_layers == binary_layers
    assert report.lce_bconv2d == binary_layers, report.op_histogram
    assert report.float_fallbacks == []
    assert report.argmax_agreement == 1.0 and report.torch_argmax_agreement == 1.0
    assert report.twin_checks, "the exact-grid twin ran"
    assert all(check["plain_argmax_agreement"] == 1.0 for check in report.twin_checks)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("exporter", ["legacy", pytest.param("dynamo", marks=pytest.mark.long)])
@pytest.mark.parametrize("form", ["slice", "split", "in-place"])
def test_a_melius_improvement_block_converts_exactly(tmp_path, form, exporter):
    _assert_exact(_convert(MeliusBlock(form), tmp_path, exporter))


class SlicedBinary(nn.Module):
    """Slices right before and right after binary convs: `a` reads `sign(x)[:, :64]`, `b`
    reads `sign(x).narrow(1, 32, 64)` (slices of a binarized tensor); half of `a`'s output goes
    through a BatchNorm (`a[:, 32:]`, a slice of a bconv's accumulator) and half of `b`'s after
    one (`chunk`), each binarized for its own binary conv, so exact ties are broken through the
    slice either way."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 128, 3, padding=1)
        self.a = binary_conv(64, 64, 3, padding=1)
        self.b = binary_conv(64, 64, 3, padding=1)
        self.bn_a = trained_bn(nn.BatchNorm2d(32), seed=3)
        self.bn_b = trained_bn(nn.BatchNorm2d(64), seed=4)
        self.c = binary_conv(32, 32, 3, padding=1)
        self.d = binary_conv(32, 32, 3, padding=1)
        self.head = nn.Linear(32 * 16, 10)

    def forward(self, x):
        s = sign(self.stem(x))
        a, b = self.a(s[:, :64]), self.b(s.narrow(1, 32, 64))
        p, q = self.bn_a(a[:, 32:]), self.bn_b(b).chunk(2, 1)[0]
        y = self.c(sign(p)) + self.d(sign(q))
        return self.head(torch.flatten(y, 1))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("exporter", ["legacy", pytest.param("dynamo", marks=pytest.mark.long)])
def test_slices_next_to_binary_convs_keep_them_binary(tmp_path, exporter):
    report = _convert(SlicedBinary(), tmp_path, exporter)
    _assert_exact(report, binary_layers=4)
    assert report.op_histogram.get("STRIDED_SLICE", 0) + report.op_histogram.get("SLICE", 0) > 0


@pytest.mark.slow
def test_binarizations_of_sliced_binary_conv_outputs_break_exact_ties_as_torch_does(tmp_path):
    """Both of `c`'s and `d`'s binarizations read a binary conv's integer accumulator under
    its BatchNorm, through a slice before (`a[:, 32:]`) or after (`chunk`) the BatchNorm: the
    translator decides their signs from the tie-broken accumulator (`exact_sources`), not from
    a rounded float where torch's sign(0) = +1 could be lost."""
    from bnnexport.converters.graph import load_onnx
    from bnnexport.converters.normalize import normalize
    from bnnexport.converters.translate import build_module
    from support.converter_nets import export

    path = export(SlicedBinary(), (1, 3, 4, 4), tmp_path / "sliced.onnx")
    _, info = build_module(normalize(load_onnx(path))[0])
    assert len(info.exact_sources) == 2, info.exact_sources
