"""BNNs as people write them outside bnnexport, for the real-client tests.

The plain-torch idioms are written here from the papers' descriptions (no code taken from their
repositories): ReActNet (Liu et al. 2020: learnable bias before the sign, RPReLU, weights
mean|w| x sign(w), the detach straight-through estimator), Bi-Real-Net (Liu et al. 2018: sign,
binary conv, BatchNorm and a real-valued shortcut per conv; AvgPool + 1x1 real conv to
downsample), XNOR-Net (Rastegari et al. 2016: plain sign activations, weights scaled by mean|w|
per output channel), IR-Net (Qin et al. 2020: weights standardised, then sign times a power-of-two
scale), a custom `autograd.Function` whose forward is `x.sign()` (also as classic BinaryNet code
applies it, after hardtanh, to activations and to the weights of nn.Conv2d / nn.Linear
subclasses), the index-put form `out[x >= 0] = 1; out[x < 0] = -1` (also on
`x.new(x.size())` inside an autograd.Function), and MeliusNet's channel slicing (Bethge et al.
2020: dense blocks append a binary conv's 64 channels, improvement blocks add one to the last 64,
`x[:, -64:] += y`). bitorch and Brevitas models come from those
libraries.

Every model is in eval mode with trained-looking BatchNorm statistics (`trained_bn`), so exact
zeros before a plain sign are as unlikely as in a trained model.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

from support.converter_nets import PlainSign, binary_conv, sign, trained_bn


def _trained(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every BatchNorm with trained-looking statistics; eval mode."""
    for k, module in enumerate(model.modules()):
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            trained_bn(module, seed=seed + k)
    return model.eval()


class SignSTE(torch.autograd.Function):
    """sign in forward, clipped identity in backward (the custom STE most code writes)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sign()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1).to(grad.dtype)


def detach_sign(x: torch.Tensor) -> torch.Tensor:
    """Bi-Real / ReActNet: sign(x) forward, a piecewise-quadratic approximation's gradient."""
    out_forward = torch.sign(x)
    mask1 = (x < -1).float()
    mask2 = (x < 0).float()
    mask3 = (x < 1).float()
    out1 = -1 * mask1 + (x * x + 2 * x) * (1 - mask1)
    out2 = out1 * mask2 + (-x * x + 2 * x) * (1 - mask2)
    out3 = out2 * mask3 + 1 * (1 - mask3)
    return out_forward.detach() - out3.detach() + out3


class ScaledSignConv(nn.Conv2d):
    """A conv whose weights are binarized in forward: mean|w| per output channel x sign(w),
    with the detach STE on the weights too (ReActNet, Bi-Real-Net, XNOR-Net)."""

    def __init__(self, *args, detach: bool = True, **kwargs):
        super().__init__(*args, bias=False, **kwargs)
        self.detach = detach

    def forward(self, x):
        w = self.weight
        scale = w.abs().mean(dim=(1, 2, 3), keepdim=True)
        binary = scale * torch.sign(w)
        if self.detach:
            clipped = torch.clamp(w, -1.0, 1.0)
            binary = binary.detach() - clipped.detach() + clipped
        return F.conv2d(x, binary, None, self.stride, self.padding)


class IRNetConv(nn.Conv2d):
    """IR-Net's weights: standardised (zero mean, unit std per output channel), then sign x a
    power-of-two scale; activations through `SignSTE` (its EDE changes only the backward)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, bias=False, **kwargs)

    def forward(self, x):
        w = self.weight
        bw = w - w.mean(dim=(1, 2, 3), keepdim=True)
        bw = bw / bw.std(dim=(1, 2, 3), keepdim=True)
        log_scale = torch.round(torch.log2(bw.abs().mean(dim=(1, 2, 3), keepdim=True)))
        scale = torch.pow(2 * torch.ones_like(log_scale), log_scale)
        return F.conv2d(SignSTE.apply(x), torch.sign(bw) * scale, None, self.stride, self.padding)


class LearnableBias(nn.Module):
    def __init__(self, channels: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.bias = nn.Parameter(torch.randn(1, channels, 1, 1, generator=g) * 0.1)

    def forward(self, x):
        return x + self.bias


class RPReLU(nn.Module):
    """ReActNet's shifted PReLU: PReLU(x - gamma) + zeta, per channel."""

    def __init__(self, channels: int, seed: int):
        super().__init__()
        self.shift_in = LearnableBias(channels, seed)
        self.prelu = nn.PReLU(channels, init=0.25)
        self.shift_out = LearnableBias(channels, seed + 1)

    def forward(self, x):
        return self.shift_out(self.prelu(self.shift_in(x)))


class ReActBlock(nn.Module):
    """ReActNet basic block: bias -> sign (detach STE) -> binary 3x3 conv -> BN -> + x -> RPReLU."""

    def __init__(self, channels: int, seed: int = 0):
        super().__init__()
        self.move = LearnableBias(channels, seed)
        self.conv = ScaledSignConv(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.act = RPReLU(channels, seed + 2)

    def forward(self, x):
        return self.act(self.bn(self.conv(detach_sign(self.move(x)))) + x)


class BiRealBlock(nn.Module):
    """Bi-Real-Net: sign -> binary conv -> BN, plus a real shortcut (AvgPool + 1x1 real conv
    + BN when the block downsamples)."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv = ScaledSignConv(cin, cout, 3, stride=stride, padding=1)
        self.bn = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.AvgPool2d(2, stride), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        shortcut = x if self.down is None else self.down(x)
        return self.bn(self.conv(detach_sign(x))) + shortcut


class Stem(nn.Sequential):
    """A real first conv (BNN papers keep the first and last layers real)."""

    def __init__(self, cin: int, cout: int):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout))


class Head(nn.Sequential):
    def __init__(self, channels: int, classes: int = 10):
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes))


def reactnet() -> nn.Module:
    torch.manual_seed(0)
    return _trained(nn.Sequential(Stem(3, 32), ReActBlock(32, 1), ReActBlock(32, 5), Head(32)))


def bireal() -> nn.Module:
    torch.manual_seed(1)
    blocks = [Stem(3, 32), BiRealBlock(32, 32), BiRealBlock(32, 64, stride=2), Head(64)]
    return _trained(nn.Sequential(*blocks))


class XnorBlock(nn.Module):
    """XNOR-Net ordering: BN -> sign -> binary conv (mean|w| x sign(w)) -> ReLU-free."""

    def __init__(self, cin: int, cout: int, pool: bool = False):
        super().__init__()
        self.bn = nn.BatchNorm2d(cin)
        self.conv = ScaledSignConv(cin, cout, 3, padding=1, detach=False)
        self.pool = pool

    def forward(self, x):
        x = self.conv(torch.sign(self.bn(x)))
        return F.max_pool2d(x, 2) if self.pool else x


def xnornet() -> nn.Module:
    torch.manual_seed(2)
    return _trained(nn.Sequential(Stem(3, 32), XnorBlock(32, 32, pool=True), XnorBlock(32, 64),
                                  Head(64)))  # fmt: skip


class IRBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = IRNetConv(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x)) + (x if x.shape[1] == self.bn.num_features else 0)


def irnet() -> nn.Module:
    torch.manual_seed(3)
    return _trained(nn.Sequential(Stem(3, 32), IRBlock(32, 32), IRBlock(32, 32), Head(32)))


class AutogradBlock(nn.Module):
    """binarize with a custom autograd.Function (forward x.sign()) -> ±1 conv -> BN."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.where(torch.randn_like(self.conv.weight) >= 0, 1.0, -1.0))
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(SignSTE.apply(x)))


def autograd_ste() -> nn.Module:
    torch.manual_seed(4)
    return _trained(nn.Sequential(Stem(3, 32), AutogradBlock(32, 32), AutogradBlock(32, 32),
                                  Head(32)))  # fmt: skip


def index_put_sign(x: torch.Tensor) -> torch.Tensor:
    """out = x.new(x.shape); out[x >= 0] = 1; out[x < 0] = -1 (sign(0) = +1)."""
    out = x.new_zeros(x.shape)
    out[x >= 0] = 1
    out[x < 0] = -1
    return out


class IndexPutBlock(AutogradBlock):
    def forward(self, x):
        return self.bn(self.conv(index_put_sign(x)))


def index_put() -> nn.Module:
    torch.manual_seed(5)
    return _trained(nn.Sequential(Stem(3, 32), IndexPutBlock(32, 32), IndexPutBlock(32, 32),
                                  Head(32)))  # fmt: skip


class ClassicBinaryConv2d(nn.Conv2d):
    """BinaryNet as first written in PyTorch: an nn.Conv2d subclass binarizing its input
    (except the image, 3 channels) and its weights with the autograd function in forward."""

    def forward(self, x):
        if x.size(1) != 3:
            x = PlainSign.apply(x)
        weight = PlainSign.apply(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding)


class ClassicBinaryLinear(nn.Linear):
    def forward(self, x):
        return F.linear(PlainSign.apply(x), PlainSign.apply(self.weight), self.bias)


def binarynet_classic() -> nn.Module:
    """conv -> BatchNorm -> hardtanh, the sign applied by the next layer (Hubara et al. 2016)."""
    torch.manual_seed(8)
    return _trained(nn.Sequential(
        ClassicBinaryConv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.Hardtanh(),
        ClassicBinaryConv2d(32, 32, 3, padding=1, bias=False), nn.MaxPool2d(2),
        nn.BatchNorm2d(32), nn.Hardtanh(), nn.Flatten(),
        ClassicBinaryLinear(32 * 8 * 8, 64, bias=False), nn.BatchNorm1d(64), nn.Hardtanh(),
        ClassicBinaryLinear(64, 10, bias=False), nn.BatchNorm1d(10),
    ))  # fmt: skip


class IndexNewSign(torch.autograd.Function):
    """An STE written with index assignment on `x.new(x.size())` (uninitialised memory, which
    the legacy exporter stores as a constant of whatever it held)."""

    @staticmethod
    def forward(ctx, x):
        out = x.new(x.size())
        out[x >= 0] = 1
        out[x < 0] = -1
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class IndexNewLinear(nn.Linear):
    def forward(self, x):
        return F.linear(IndexNewSign.apply(x), IndexNewSign.apply(self.weight), self.bias)


def index_new_linear() -> nn.Module:
    torch.manual_seed(9)
    return _trained(nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 16 * 16, 64), nn.BatchNorm1d(64),
        IndexNewLinear(64, 64, bias=False), nn.BatchNorm1d(64), nn.Linear(64, 10),
    ))  # fmt: skip


MELIUS_GROWTH = 64  # the channels each MeliusNet block adds (dense) or improves


class MeliusBinary(nn.Module):
    """BatchNorm -> binarize -> 3x3 ±1 conv (zero padding): MeliusNet's binary unit."""

    def __init__(self, cin: int, seed: int = 0):
        super().__init__()
        self.bn = trained_bn(nn.BatchNorm2d(cin), seed=seed)
        self.conv = binary_conv(cin, MELIUS_GROWTH, 3, padding=1)

    def forward(self, x):
        return self.conv(sign(self.bn(x)))


class MeliusBlock(nn.Module):
    """float stem -> dense block (x = cat([x, binary(x)])) -> improvement block (binary(x)
    added to the last 64 channels of x), written as `form` says: "slice" (`torch.cat([x[:, :-64],
    x[:, -64:] + y])`), "split" (`torch.split`) or "in-place" (`x[:, -64:] += y`) -> float
    head. Takes (N, 3, 4, 4)."""

    def __init__(self, form: str = "slice", width: int = 64):
        super().__init__()
        self.form = form
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.dense = MeliusBinary(width, seed=1)
        self.improve = MeliusBinary(width + MELIUS_GROWTH, seed=2)
        self.head = nn.Linear((width + MELIUS_GROWTH) * 16, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.cat([x, self.dense(x)], 1)
        y = self.improve(x)
        if self.form == "slice":
            x = torch.cat([x[:, :-MELIUS_GROWTH], x[:, -MELIUS_GROWTH:] + y], 1)
        elif self.form == "split":
            kept, last = torch.split(x, [x.shape[1] - MELIUS_GROWTH, MELIUS_GROWTH], dim=1)
            x = torch.cat([kept, last + y], 1)
        else:  # "in-place"
            x = x.clone()
            x[:, -MELIUS_GROWTH:] += y
        return self.head(torch.flatten(x, 1))


def melius(form: str) -> nn.Module:
    torch.manual_seed(10)
    return MeliusBlock(form).eval()


PLAIN_TORCH = {
    "reactnet": (reactnet, (1, 3, 16, 16)),
    "bireal": (bireal, (1, 3, 16, 16)),
    "xnornet": (xnornet, (1, 3, 16, 16)),
    "irnet": (irnet, (1, 3, 16, 16)),
    "autograd-ste": (autograd_ste, (1, 3, 16, 16)),
    "index-put": (index_put, (1, 3, 16, 16)),
    "binarynet-classic": (binarynet_classic, (1, 3, 16, 16)),
    "index-new-linear": (index_new_linear, (1, 3, 16, 16)),
    "melius-in-place": (lambda: melius("in-place"), (1, 3, 4, 4)),
    "melius-split": (lambda: melius("split"), (1, 3, 4, 4)),
}


def bitorch_model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    """A bitorch 0.4.1 model in its (default) binary configuration."""
    import bitorch.models as models

    torch.manual_seed(6)
    if name == "lenet":
        return _trained(models.LeNet([1, 1, 28, 28], 10)), (1, 1, 28, 28)
    shape = (1, 3, 32, 32)
    factory = {
        "resnete18": models.ResnetE18,
        "resnet18v1": models.Resnet18V1,
        "quicknetsmall": models.QuickNetSmall,
    }[name]
    return _trained(factory(input_shape=list(shape), num_classes=10)), shape


def brevitas_model() -> tuple[nn.Module, tuple[int, ...]]:
    """A small Brevitas 0.13 CNN with its binary weight and activation quantizers."""
    import brevitas.nn as qnn
    from brevitas.quant import SignedBinaryActPerTensorConst, SignedBinaryWeightPerTensorConst

    torch.manual_seed(7)

    def qconv(cin: int, cout: int) -> nn.Module:
        return qnn.QuantConv2d(cin, cout, 3, padding=1, bias=False,
                               weight_quant=SignedBinaryWeightPerTensorConst)  # fmt: skip

    def qact() -> nn.Module:
        return qnn.QuantIdentity(act_quant=SignedBinaryActPerTensorConst)

    net = nn.Sequential(
        Stem(3, 32),
        qact(), qconv(32, 32), nn.BatchNorm2d(32),
        qact(), qconv(32, 32), nn.BatchNorm2d(32), nn.MaxPool2d(2),
        Head(32),
    )  # fmt: skip
    return _trained(net), (1, 3, 16, 16)


def export_onnx(model: nn.Module, shape: tuple[int, ...], path: Path, exporter: str) -> Path:
    """Export with "legacy" (opset 13: bitorch's autograd functions break opset 17's
    constant folding in torch 2.13), "dynamo" or, for Brevitas, "qonnx"."""
    x = torch.randn(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "qonnx":
            from brevitas.export import export_qonnx

            export_qonnx(model, x, export_path=str(path))
        elif exporter == "legacy":
            torch.onnx.export(model, x, str(path), dynamo=False, opset_version=13)
        else:
            torch.onnx.export(model, x, str(path), dynamo=True)
    return path


def sample_inputs(shape: tuple[int, ...], samples: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((samples, *shape[1:])).astype(np.float32)


def load(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path))


@dataclass(frozen=True)
class Row:
    """One row of the real-client matrix: a model, an exporter, and the normaliser pass without
    which it cannot convert (with the op type of the first unsupported node, in graph order,
    that the one-line refusal then names)."""

    client: str
    model: str
    exporter: str
    key_pass: str
    refused_op: str
    slow: bool = False

    @property
    def id(self) -> str:
        return f"{self.client}-{self.model}-{self.exporter}"

    def build(self) -> tuple[nn.Module, tuple[int, ...]]:
        if self.client == "plain-torch":
            factory, shape = PLAIN_TORCH[self.model]
            return factory(), shape
        if self.client == "brevitas":
            return brevitas_model()
        return bitorch_model(self.model)


ROWS = [
    *[Row("bitorch", m, e, "bitorch-sign", "Equal", slow=m != "lenet")
      for m in ("lenet", "resnete18", "resnet18v1", "quicknetsmall") for e in ("legacy", "dynamo")],
    Row("brevitas", "binary-cnn", "qonnx", "qonnx-bipolar", "BipolarQuant"),
    Row("brevitas", "binary-cnn", "dynamo", "cast-compare", "Greater"),
    *[Row("plain-torch", m, e, p, op)
      for m, p, op in (("reactnet", "ste-detach", "Less"), ("bireal", "ste-detach", "Less"),
                       ("xnornet", "fold-constants", "ReduceMean"), ("irnet", "plain-sign", "Sign"),
                       ("autograd-ste", "plain-sign", "Sign"))
      for e in ("legacy", "dynamo")],
    Row("plain-torch", "index-put", "legacy", "where-compare", "GreaterOrEqual"),
    Row("plain-torch", "index-put", "dynamo", "index-put", "GreaterOrEqual"),
    *[Row("plain-torch", "binarynet-classic", e, "plain-sign", "Sign")
      for e in ("legacy", "dynamo")],
    Row("plain-torch", "index-new-linear", "legacy", "where-compare", "GreaterOrEqual"),
    Row("plain-torch", "index-new-linear", "dynamo", "index-put", "GreaterOrEqual"),
    *[Row("plain-torch", "melius-in-place", e, "scatter-concat", "ScatterND", slow=True)
      for e in ("legacy", "dynamo")],
    # the legacy exporter at opset 13 writes torch.split as Slices already
    Row("plain-torch", "melius-split", "dynamo", "split-slices", "Split", slow=True),
]  # fmt: skip
