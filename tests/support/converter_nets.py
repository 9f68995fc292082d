"""Small BNNs written with plain torch ops (no bnnexport layers), for the converter tests.

`convert_net` exports one with the legacy exporter, converts it with `converters.lce`, and
returns the result together with the torch outputs on the same inputs, so a test can check
the flatbuffer against PyTorch as well as against ONNX Runtime (which the gate already does).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def sign(x: torch.Tensor) -> torch.Tensor:
    """Binarization with sign(0) = +1, as the torch exporter writes Sign -> Add -> Sign."""
    return torch.sign(torch.sign(x) + 0.1)


def torch_sign(x: np.ndarray) -> np.ndarray:
    """`sign` in NumPy, in x's dtype: +1 at 0 and at -0.0 (where LCE's sign-bit rule gives -1)."""
    return np.where(x >= 0, 1.0, -1.0).astype(x.dtype)


class PlainSign(torch.autograd.Function):
    """The STE of much user code: forward x.sign() (0 -> 0), backward straight through."""

    @staticmethod
    def forward(ctx, x):
        return x.sign()

    @staticmethod
    def backward(ctx, grad):
        return grad


def binary_conv(cin: int, cout: int, kernel: int = 3, **kwargs) -> nn.Conv2d:
    """A Conv2d whose kernel is exactly ±1."""
    conv = nn.Conv2d(cin, cout, kernel, bias=kwargs.pop("bias", False), **kwargs)
    with torch.no_grad():
        conv.weight.copy_(torch.where(torch.randn_like(conv.weight) >= 0, 1.0, -1.0))
    return conv


def binary_linear(fin: int, fout: int, bias: bool = False) -> nn.Linear:
    """A Linear whose kernel is exactly ±1."""
    fc = nn.Linear(fin, fout, bias=bias)
    with torch.no_grad():
        fc.weight.copy_(torch.where(torch.randn_like(fc.weight) >= 0, 1.0, -1.0))
    return fc


def trained_bn(bn: nn.BatchNorm2d | nn.BatchNorm1d, seed: int = 0) -> nn.Module:
    """Give a BatchNorm non-trivial statistics, as after training (ties become unlikely)."""
    g = torch.Generator().manual_seed(seed)
    n = bn.num_features
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(n, generator=g) * 3 + 0.37)
        bn.running_var.copy_(torch.rand(n, generator=g) * 20 + 1)
        bn.weight.copy_(torch.rand(n, generator=g) + 0.5)
        bn.bias.copy_(torch.randn(n, generator=g) * 0.3)
    return bn


class BinaryBlock(nn.Module):
    """binarize -> (pad) -> ±1 conv -> BatchNorm, with one- or zero-padding."""

    def __init__(self, cin, cout, stride=1, padding="one", pool=False, kernel=3):
        super().__init__()
        self.padding = padding
        pad = kernel // 2 if padding == "zero" else 0
        self.conv = binary_conv(cin, cout, kernel, stride=stride, padding=pad)
        self.bn = trained_bn(nn.BatchNorm2d(cout), seed=cout + stride)
        self.pool = pool
        self.k = kernel // 2

    def forward(self, x):
        x = sign(x)
        if self.padding == "one":
            x = F.pad(x, (self.k,) * 4, value=1.0)
        x = self.bn(self.conv(x))
        return F.max_pool2d(x, 2) if self.pool else x


class StemAndBinaryConv(nn.Module):
    """The smallest BNN a user might write: a float 3x3 stem (2 -> 8 channels), a sign, one
    binary 3x3 conv (8 -> 4), flattened. Takes (N, 2, 7, 7)."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(2, 8, 3)
        self.conv = binary_conv(8, 4)

    def forward(self, x):
        return self.conv(sign(self.first(x))).flatten(1)


def lce_grouped_flatbuffer(path: Path, channels: int = 64, groups: int = 2, size: int = 8) -> Path:
    """A flatbuffer holding one grouped `LceBconv2d`, as LCE's own converter writes it from a
    grouped ±1 filter with 32 input channels per group: what another tool's flatbuffer may hold
    (bnnexport writes one LceBconv2d per group). Input NCHW [1, channels, size, size]."""
    import tempfile

    import larq_compute_engine as lce
    from bnnexport.converters.runtimes import tf

    tensorflow = tf()
    rng = np.random.default_rng(0)
    kernel = np.where(rng.standard_normal((3, 3, channels // groups, channels)) >= 0, 1.0, -1.0)
    spec = tensorflow.TensorSpec([1, channels, size, size], tensorflow.float32)

    class Grouped(tensorflow.Module):
        @tensorflow.function(input_signature=[spec])
        def serve(self, x):
            x = tensorflow.transpose(x, [0, 2, 3, 1])
            binary = tensorflow.sign(tensorflow.sign(x) + 0.1)
            y = tensorflow.nn.conv2d(binary, kernel.astype(np.float32), 1, "VALID")
            return tensorflow.reshape(y, [1, -1])

    module = Grouped()
    with tempfile.TemporaryDirectory() as saved:
        tensorflow.saved_model.save(module, saved, signatures=module.serve)
        path.write_bytes(lce.convert_saved_model(saved, target="arm"))
    return path


def export(net: nn.Module, shape: tuple[int, ...], path: Path, **kwargs) -> Path:
    net.eval()
    torch.onnx.export(net, torch.randn(*shape), str(path), dynamo=False, **kwargs)
    return path


def snap_to_grid(net: nn.Module, step: float = 1 / 64) -> nn.Module:
    """Round the float conv/dense parameters to multiples of `step` (±1 kernels stay).

    With inputs on the same grid, every conv and dense sum is exact in float32 whatever the
    summation order, so ONNX Runtime, TFLite and LCE cannot binarize a pre-activation that
    sits within rounding of a threshold differently (the reference's own ambiguity, which
    would make a test depend on the random seed).
    """
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                for param in (module.weight, module.bias):
                    if param is not None:
                        param.copy_(torch.round(param / step) * step)
    return net


def grid_inputs(samples: int, shape: tuple[int, ...], seed: int = 1) -> np.ndarray:
    """Random inputs in [-2, 2) on the 1/64 grid (see `snap_to_grid`)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 128, (samples, *shape[1:])) / 64.0).astype(np.float32)


def convert_net(net: nn.Module, shape: tuple[int, ...], tmp_path: Path, samples: int = 16, **kw):
    """Export, convert (gate on), and return (result, agreement of the flatbuffer with torch)
    on the same inputs. Parameters and inputs are snapped to a grid, see `snap_to_grid`."""
    from bnnexport.converters.gate import compare_outputs
    from bnnexport.converters.lce import convert_onnx
    from bnnexport.converters.runtimes import run_lce

    onnx_path = export(snap_to_grid(net), shape, tmp_path / "net.onnx", **kw)
    x = grid_inputs(samples, shape)
    result = convert_onnx(onnx_path, tmp_path / "net.tflite", inputs=x)
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    versus_torch = compare_outputs(expected, run_lce(result.output, x))
    return result, versus_torch


class FloatStemBinaryBody(nn.Module):
    """float 3x3 stem + BatchNorm -> one-padded binary block with max-pool -> binary block ->
    flatten -> float dense head: every float layer an int8 candidate, the binary layers
    between them. Takes (N, 3, 8, 8)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.bn0 = trained_bn(nn.BatchNorm2d(32), seed=1)
        self.a = BinaryBlock(32, 32, padding="one", pool=True)
        self.b = BinaryBlock(32, 32, padding="one")
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = self.bn0(self.stem(x))
        return self.head(torch.flatten(self.b(self.a(x)), 1))


class BiRealDownsample(nn.Module):
    """A float stem, a Bi-Real block with an identity shortcut (x + BN(binary conv(sign(x)))),
    then Bi-Real's downsampling block: BN(binary 3x3/2 conv(sign(x))) plus the float shortcut
    avg-pool 2x2 -> 1x1 conv -> BN, a global average and a float dense head. The shortcut
    conv reads the residual stream, which no float layer writes. Takes (N, 3, 8, 8)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.bn0 = trained_bn(nn.BatchNorm2d(32), seed=1)
        self.same = BinaryBlock(32, 32, padding="one")
        self.down = binary_conv(32, 64, 3, stride=2, padding=1)
        self.bn1 = trained_bn(nn.BatchNorm2d(64), seed=2)
        self.shortcut = nn.Conv2d(32, 64, 1, bias=False)
        self.bn2 = trained_bn(nn.BatchNorm2d(64), seed=3)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        x = self.bn0(self.stem(x))
        x = x + self.same(x)
        x = self.bn1(self.down(sign(x))) + self.bn2(self.shortcut(F.avg_pool2d(x, 2)))
        return self.head(x.mean((2, 3)))
