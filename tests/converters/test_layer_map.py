"""Flatbuffer ops -> PyTorch layers (converters.layer_map): the translator's name scopes survive
the converters, and every op of a converted model is traced back to the module it came from.

The oracle is the flatbuffer itself: a conv-like op's filter has the output channels and kernel
size of the module it is mapped to, and every conv-like module is mapped exactly once."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
import torch.nn as nn
from bnnexport.converters.flatbuffer import flatbuffer_ops
from bnnexport.converters.layer_map import (
    CONV_OPS,
    TOP,
    module_path,
    module_path_of_name,
    op_layers,
    scope_name,
)
from support.converter_nets import (
    binary_conv,
    binary_linear,
    grid_inputs,
    sign,
    snap_to_grid,
    trained_bn,
)


def test_legacy_names_give_module_paths():
    assert module_path_of_name("/features/features.5/input_quantizer/Sign_1") == (
        "features.5.input_quantizer"
    )
    assert module_path_of_name("/layer1/layer1.0/conv1/Conv") == "layer1.0.conv1"
    assert module_path_of_name("/blocks/blocks.4/shortcut/shortcut.1/Conv") == (
        "blocks.4.shortcut.1"
    )
    assert module_path_of_name("/blocks/blocks.0/blocks.0.0/Conv") == "blocks.0.0"
    assert module_path_of_name("/Flatten") == TOP
    assert module_path_of_name("binarize_3") is None  # a normaliser's node: no module


def test_dynamo_metadata_gives_module_paths():
    node = onnx.helper.make_node("Sign", ["x"], ["y"], name="node_sign_2")
    entry = node.metadata_props.add()
    entry.key, entry.value = "pkg.torch.onnx.name_scopes", "['', 'blocks', 'blocks.1.q', 'sign_2']"
    assert module_path(node) == "blocks.1.q"
    entry.value = "['', 'view']"
    assert module_path(node) == TOP


def test_scope_names_are_valid_tensorflow_scopes():
    assert scope_name("features.5", "/features/features.5/Conv") == "features.5/Conv"
    assert scope_name("blocks[0]", "node:conv 1") == "blocks_0_/node_conv_1"
    assert scope_name("_private", "x") == "n_private/x"


class Shortcut(nn.Module):
    """A binary block with a float 1x1 shortcut in a nested Sequential (`shortcut.1`), so the
    model has a branch and the legacy exporter's numbered scope names."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = binary_conv(cin, cout, padding=1)
        self.bn = trained_bn(nn.BatchNorm2d(cout), seed=cout)
        self.shortcut = nn.Sequential(nn.Identity(), nn.Conv2d(cin, cout, 1))

    def forward(self, x):
        return self.bn(self.conv(sign(x))) + self.shortcut(x)


class HandWritten(nn.Module):
    """A float stem, two binary blocks (one with a shortcut) in a Sequential, a binary head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(2, 8, 3)
        self.blocks = nn.Sequential(
            nn.Sequential(binary_conv(8, 8, padding=1), trained_bn(nn.BatchNorm2d(8))),
            Shortcut(8, 16),
        )
        self.head = binary_linear(16 * 6 * 6, 10)

    def forward(self, x):
        x = self.stem(x)
        x = self.blocks[0](sign(x))
        x = self.blocks[1](x)
        return self.head(sign(x.flatten(1)))


SHAPE = (1, 2, 8, 8)


def _convert(
    net: nn.Module, tmp_path: Path, dynamo: bool, input_layout: str | None = None
) -> tuple[Path, Path]:
    from bnnexport.converters.lce import ConvertOptions, convert_onnx

    onnx_path = tmp_path / "net.onnx"
    net = snap_to_grid(net).eval()
    torch.onnx.export(net, (torch.randn(*SHAPE),), str(onnx_path), dynamo=dynamo)
    model = onnx.load(str(onnx_path))  # one file: the dynamo exporter may write NAME.onnx.data
    onnx.save(model, str(onnx_path))
    x = grid_inputs(4, SHAPE)
    options = ConvertOptions(twin=False, input_layout=input_layout)
    result = convert_onnx(onnx_path, tmp_path / "net.tflite", inputs=x, options=options)
    return onnx_path, result.output


def check_conv_ops_name_their_modules(net: nn.Module, flatbuffer: Path, onnx_path: Path) -> None:
    """Every conv-like op maps to a module whose weight has its filter's shape, every
    conv-like module to exactly one op, and every op to some layer."""
    modules = dict(net.named_modules())
    mapped = op_layers(flatbuffer, onnx_path)
    ops = flatbuffer_ops(flatbuffer)
    assert all(m.layer and m.how != "none" for m in mapped), mapped
    seen = []
    for op, layer in zip(ops, mapped, strict=True):
        if op.op_type not in CONV_OPS:
            continue
        module = modules.get(layer.layer)
        assert module is not None, (layer, sorted(modules))
        filter_shape = op.input_shapes[1]
        if isinstance(module, nn.BatchNorm2d):  # dynamo folds a BatchNorm into its conv
            assert filter_shape[0] == module.num_features, (layer, filter_shape)
        else:
            weight = list(module.weight.shape)
            assert filter_shape[0] == weight[0], (layer, filter_shape, weight)
            if len(weight) == 4:
                assert filter_shape[1:3] == weight[2:4], (layer, filter_shape, weight)
        assert layer.binary == (op.op_type == "LceBconv2d")
        seen.append(layer.layer)
    assert len(seen) == len(set(seen)) == 5, seen  # stem, 2 binary convs, shortcut, head


@pytest.fixture(scope="module")
def legacy(tmp_path_factory) -> tuple[nn.Module, Path, Path]:
    """The hand-written model, exported with the legacy exporter and converted (one
    conversion for the tests of this module)."""
    torch.manual_seed(0)
    net = HandWritten().eval()
    return net, *_convert(net, tmp_path_factory.mktemp("legacy"), dynamo=False)


@pytest.fixture(scope="module")
def legacy_nchw(tmp_path_factory) -> tuple[nn.Module, Path, Path]:
    """The same, converted with NCHW input: the model then turns its input NHWC itself."""
    torch.manual_seed(0)
    net = HandWritten().eval()
    return net, *_convert(net, tmp_path_factory.mktemp("nchw"), dynamo=False, input_layout="nchw")


def _check_named(net: nn.Module, onnx_path: Path, flatbuffer: Path) -> None:
    check_conv_ops_name_their_modules(net, flatbuffer, onnx_path)
    mapped = op_layers(flatbuffer, onnx_path)
    assert "(input)" not in {m.layer for m in mapped}  # NHWC input (the default): no transpose
    # the binarizations LCE runs as LceQuantize are named after the torch code that wrote them
    # (the sign() calls in HandWritten.forward and Shortcut.forward), not after the conv
    quantize = [m for m in mapped if m.op_type == "LceQuantize"]
    assert quantize and all(m.how == "name" and m.binary for m in quantize), quantize
    assert {m.layer for m in quantize} <= {TOP, "blocks.1"}, quantize


@pytest.mark.slow
def test_every_op_of_a_legacy_export_names_its_module(legacy):
    _check_named(*legacy)


@pytest.mark.slow
def test_the_input_transpose_of_an_nchw_flatbuffer_is_the_input_layer(legacy_nchw):
    """`--input-layout nchw`: the one TRANSPOSE turning the input NHWC is `(input)` (a row of
    its own in bench's time by layer), and the convs still name their modules."""
    net, onnx_path, flatbuffer = legacy_nchw
    check_conv_ops_name_their_modules(net, flatbuffer, onnx_path)
    mapped = op_layers(flatbuffer, onnx_path)
    assert [m.op_type for m in mapped if m.layer == "(input)"] == ["TRANSPOSE"]


@pytest.mark.slow
@pytest.mark.long  # a second export and conversion (20 s); the legacy one is the fast variant
def test_every_op_of_a_dynamo_export_names_its_module(tmp_path):
    torch.manual_seed(0)
    net = HandWritten().eval()
    _check_named(net, *_convert(net, tmp_path, dynamo=True))


@pytest.mark.slow
def test_names_alone_name_every_op(legacy):
    """Without the ONNX model, ops keep the layers their names show; a conv-like op whose own
    name the converters cut takes the layer of the op feeding it, never none."""
    _net, onnx_path, flatbuffer = legacy
    with_onnx = op_layers(flatbuffer, onnx_path)
    alone = op_layers(flatbuffer)
    for a, b in zip(with_onnx, alone, strict=True):
        if b.how == "name":
            assert a.layer == b.layer, (a, b)
    assert all(m.how != "none" for m in alone)


REDUCED = {"binarynet": (3, 16, 16), "birealnet18": (3, 32, 32), "mnist-bnn": (1, 28, 28)}


@pytest.mark.slow
@pytest.mark.long  # 20-40 s each on a loaded machine; the hand-written model is the fast variant
@pytest.mark.parametrize("name", sorted(REDUCED))
def test_zoo_models_name_every_conv_op_by_its_module(tmp_path, name):
    from bnnexport.stages.init import init_model

    model = init_model(name, REDUCED[name], num_classes=10).eval()
    onnx_path = tmp_path / "model.onnx"
    torch.onnx.export(model, torch.zeros(1, *REDUCED[name]), str(onnx_path), dynamo=False)
    from bnnexport.converters.lce import ConvertOptions, convert_onnx

    result = convert_onnx(onnx_path, tmp_path / "model.tflite", options=ConvertOptions(twin=False))
    modules = dict(model.named_modules())
    convs = [n for n, m in modules.items() if isinstance(m, (nn.Conv2d, nn.Linear))]
    mapped = op_layers(result.output, onnx_path)
    conv_ops = [(op, m) for op, m in zip(flatbuffer_ops(result.output), mapped, strict=True)
                if op.op_type in CONV_OPS]  # fmt: skip
    assert sorted(m.layer for _, m in conv_ops) == sorted(convs)
    for op, m in conv_ops:
        weight = list(modules[m.layer].weight.shape)
        assert op.input_shapes[1][0] == weight[0], (m, op.input_shapes[1], weight)
    assert all(m.how != "none" for m in mapped)
