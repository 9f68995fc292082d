"""Grouped convolutions convert exactly, and binary ones stay binary where LCE can run them.

- at least 16 input channels per group: one `LceBconv2d` per group on its channel slice,
  concatenated (`converters.translate.groups`), with every padding strategy, stride and
  dilation; LCE's default kernels, which an app's interpreter uses, run it, where they refuse
  the one grouped `LceBconv2d` LCE's own converter writes for 32 channels per group;
- fewer (binary depthwise): refused in one line naming LCE's rule, before TensorFlow runs, and
  exact as a float layer with `--allow-float`;
- float grouped convs (ShuffleNet's two grouped convs around a channel shuffle): one conv per
  group, concatenated.

Every model is written here in plain torch, exported with both torch exporters and converted
with `bnnexport.convert_module` (ONNX Runtime, the exact-grid twin, then PyTorch).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from bnnexport.converters.translate.groups import plan_binary_groups
from support.converter_nets import binary_conv, lce_grouped_flatbuffer, sign, trained_bn

pytestmark = pytest.mark.usefixtures("seeded")  # random ±1 kernels, the same every run

EXPORTERS = ["legacy", "dynamo"]


def shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """ShuffleNet's channel shuffle."""
    n, c, h, w = x.shape
    return x.reshape(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class GroupedBinary(nn.Module):
    """float stem -> binarize -> grouped ±1 conv -> BatchNorm -> (channel shuffle) -> binarize
    -> grouped ±1 conv -> BatchNorm -> float head. `padding`: "one" (F.pad with +1 after the
    sign), "zero" (the conv's own), "minus" (F.pad with -1)."""

    def __init__(self, width, groups, stride=1, padding="zero", dilation=1, shuffled=False,
                 size=8):  # fmt: skip
        super().__init__()
        self.padding, self.groups, self.shuffled = padding, groups, shuffled
        self.pad = dilation
        own = dilation if padding == "zero" else 0
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.a = binary_conv(width, width, 3, stride=stride, padding=own, dilation=dilation,
                             groups=groups)  # fmt: skip
        self.bn_a = trained_bn(nn.BatchNorm2d(width), seed=1)
        self.b = binary_conv(width, width, 3, padding=own, dilation=dilation, groups=groups)
        self.bn_b = trained_bn(nn.BatchNorm2d(width), seed=2)
        out = (size - 1) // stride + 1
        self.head = nn.Linear(width * out * out, 10)

    def _binary(self, conv, x):
        x = sign(x)
        if self.padding in ("one", "minus"):
            x = F.pad(x, (self.pad,) * 4, value=1.0 if self.padding == "one" else -1.0)
        return conv(x)

    def forward(self, x):
        x = self.bn_a(self._binary(self.a, self.stem(x)))
        if self.shuffled:
            x = shuffle(x, self.groups)
        x = self.bn_b(self._binary(self.b, x))
        return self.head(torch.flatten(x, 1))


class ShuffleFloat(nn.Module):
    """ShuffleNet-style float unit (1x1 grouped conv, shuffle, 3x3 grouped conv) between two
    binary convs."""

    def __init__(self, width=32, groups=4):
        super().__init__()
        self.groups = groups
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.g1 = nn.Conv2d(width, width, 1, groups=groups)
        self.g2 = nn.Conv2d(width, width, 3, padding=1, groups=groups, stride=2)
        self.binary = binary_conv(width, width, 3, padding=1)
        self.bn = trained_bn(nn.BatchNorm2d(width))
        self.head = nn.Linear(width * 16, 10)

    def forward(self, x):
        x = self.bn(self.binary(sign(self.stem(x))))
        x = self.g2(shuffle(F.relu(self.g1(x)), self.groups))
        return self.head(torch.flatten(x, 1))


def _convert(net, tmp_path, exporter, size=8, **kwargs):
    from bnnexport import convert_module

    return convert_module(net, torch.randn(1, 3, size, size), out=tmp_path / "n.tflite",
                          exporter=exporter, **kwargs)  # fmt: skip


def _assert_exact(report, bconv2d, binary_layers=2):
    assert report.binary_layers == binary_layers
    assert report.lce_bconv2d == bconv2d, report.op_histogram
    assert report.float_fallbacks == []
    assert report.argmax_agreement == 1.0 and report.torch_argmax_agreement == 1.0
    assert report.torch_max_abs_diff <= 1e-4 * 100, report.torch_max_abs_diff
    assert report.twin_checks, "the exact-grid twin ran"
    assert all(check["plain_argmax_agreement"] == 1.0 for check in report.twin_checks)
    assert report.lce_settings == {}  # LCE's default interpreter settings run it


def test_the_group_plan_splits_every_grouped_binary_conv_and_refuses_under_16_per_group():
    assert plan_binary_groups(64, 1).kind == "single"
    assert {plan_binary_groups(c, g).kind for c, g in [(64, 2), (128, 4), (64, 4), (48, 3)]} == {
        "split"
    }
    refused = plan_binary_groups(32, 32)
    assert refused.kind == "refuse" and "depthwise" in refused.why
    assert "at least 16 input channels per group" in refused.why


# groups of 32 input channels: stride 2 with zero padding on an even size (the corrected
# strategy) and +1 padding (LCE's pad_values=1), a channel shuffle between the two convs
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(
    "groups, padding, stride", [(2, "zero", 2), (4, "one", 1)], ids=["g2-zero-s2", "g4-one"]
)
def test_groups_of_32_channels_are_one_lce_bconv2d_per_group(tmp_path, exporter, groups,
                                                             padding, stride):  # fmt: skip
    net = GroupedBinary(32 * groups, groups, stride=stride, padding=padding, shuffled=True)
    _assert_exact(_convert(net, tmp_path, exporter), bconv2d=2 * groups)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_a_grouped_flatbuffer_runs_in_an_interpreter_made_the_way_an_app_makes_it(tmp_path):
    """`Interpreter(buf, num_threads=1)`, LCE's defaults: bnnexport's grouped flatbuffer runs
    there as in the gate's interpreter (indirect BGEMM); the one grouped LceBconv2d LCE's own
    converter writes fails to prepare there, and runs only with indirect BGEMM."""
    import numpy as np
    from bnnexport.converters.runtimes import lce_kernel_settings, stderr_filtered
    from larq_compute_engine.tflite.python.interpreter import Interpreter

    _convert(GroupedBinary(64, 2, padding="one"), tmp_path, "legacy")
    ours = (tmp_path / "n.tflite").read_bytes()
    # NHWC, as the flatbuffer declares (arm64's default): what an app feeds it
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 3)).astype(np.float32)
    by_default = Interpreter(ours, num_threads=1).predict(x)
    indirect = Interpreter(ours, num_threads=1, use_indirect_bgemm=True).predict(x)
    np.testing.assert_array_equal(by_default, indirect)
    assert lce_kernel_settings(ours).flags == {}

    theirs = lce_grouped_flatbuffer(tmp_path / "lce-grouped.tflite").read_bytes()
    said: list[str] = []
    with pytest.raises(RuntimeError), stderr_filtered(lambda line: said.append(line) or True):
        Interpreter(theirs, num_threads=1)
    assert any("Grouped binary convolutions are not supported with this kernel" in s for s in said)
    assert any("(LceBconv2d) failed to prepare" in s for s in said)
    Interpreter(theirs, num_threads=1, use_indirect_bgemm=True).predict(
        np.zeros((1, 64, 8, 8), np.float32)
    )
    needed = lce_kernel_settings(theirs)
    assert needed.flags == {"use_indirect_bgemm": True} and "Grouped binary" in needed.refusal


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_groups_of_16_channels_are_one_lce_bconv2d_per_group(tmp_path, exporter):
    net = GroupedBinary(64, 4, padding="zero", shuffled=True)
    _assert_exact(_convert(net, tmp_path, exporter), bconv2d=8)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_float_grouped_convs_around_a_channel_shuffle_convert(tmp_path, exporter):
    report = _convert(ShuffleFloat(), tmp_path, exporter)
    _assert_exact(report, bconv2d=1, binary_layers=1)
    assert report.float_conv2d == 1 + 4 + 4, report.op_histogram  # stem, two split convs


def test_a_binary_depthwise_conv_is_refused_in_one_line_before_tensorflow(tmp_path):
    from bnnexport.converters.errors import FloatFallbackError

    net = GroupedBinary(32, 32, padding="zero")
    with pytest.raises(FloatFallbackError) as error:
        _convert(net, tmp_path, "legacy")
    message = str(error.value)
    assert "\n" not in message
    assert "depthwise binary convolution with 32 groups of 1 input channel(s)" in message
    assert "at least 16 input channels per group" in message and "--allow-float" in message
    assert not (tmp_path / "n.tflite").exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_a_binary_depthwise_conv_allowed_float_is_exact(tmp_path):
    net = GroupedBinary(32, 32, padding="zero")
    report = _convert(net, tmp_path, "legacy", allow_float=("all",))
    assert report.lce_bconv2d == 0 and len(report.float_fallbacks) == 2
    assert report.argmax_agreement == 1.0 and report.torch_argmax_agreement == 1.0


# more geometries: the long tier
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(
    "width, groups, padding, stride, dilation",
    [
        (128, 2, "zero", 1, 1),  # 64 channels per group, LCE's SAME zero padding per group
        (128, 2, "one", 2, 1),
        (256, 4, "zero", 2, 1),
        (64, 2, "zero", 1, 2),
        (64, 2, "minus", 1, 1),
        (96, 6, "one", 2, 1),  # 16 per group
        (48, 2, "minus", 1, 2),  # 24 per group
    ],
)
def test_grouped_binary_geometries(tmp_path, exporter, width, groups, padding, stride, dilation):
    net = GroupedBinary(width, groups, stride=stride, padding=padding, dilation=dilation,
                        size=9)  # fmt: skip
    _assert_exact(_convert(net, tmp_path, exporter, size=9), bconv2d=2 * groups)
