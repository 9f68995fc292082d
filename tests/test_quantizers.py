"""Quantizers: forward is sign with sign(0) = +1; each has its documented pseudo-gradient."""

import io

import onnx
import pytest
import torch

from bnnexport.quantizers import get_quantizer, list_quantizers


@pytest.mark.parametrize("name", ["ste_sign", "approx_sign", "swish_sign"])
def test_forward_is_sign_with_zero_mapped_to_plus_one(name):
    q = get_quantizer(name)
    x = torch.tensor([-2.0, -0.3, -0.0, 0.0, 0.3, 2.0], requires_grad=True)
    assert q(x).tolist() == [-1.0, -1.0, 1.0, 1.0, 1.0, 1.0]


def test_ste_sign_passes_gradient_only_where_abs_x_at_most_one():
    x = torch.tensor([-1.5, -1.0, 0.2, 1.0, 1.01], requires_grad=True)
    get_quantizer("ste_sign")(x).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_approx_sign_gradient_is_two_minus_two_abs_x():
    x = torch.tensor([-1.5, -0.5, 0.0, 0.25, 1.0], requires_grad=True)
    get_quantizer("approx_sign")(x).sum().backward()
    assert torch.allclose(x.grad, torch.tensor([0.0, 1.0, 2.0, 1.5, 0.0]))


def test_swish_sign_gradient_matches_its_formula():
    x = torch.tensor([-0.4, 0.0, 0.1, 0.7], requires_grad=True)
    get_quantizer("swish_sign")(x).sum().backward()
    beta = 5.0
    bx = beta * x.detach()
    expected = beta * (2 - bx * torch.tanh(bx / 2)) / (1 + torch.cosh(bx))
    assert torch.allclose(x.grad, expected)
    assert x.grad[1] == pytest.approx(beta)  # the peak at 0


def test_unknown_quantizer_names_the_known_ones():
    with pytest.raises(ValueError, match="ste_sign"):
        get_quantizer("nope")
    assert {"ste_sign", "approx_sign", "swish_sign"} <= set(list_quantizers())


@pytest.mark.parametrize("name", ["ste_sign", "approx_sign", "swish_sign"])
def test_onnx_export_writes_sign_add_sign(name):
    buffer = io.BytesIO()
    torch.onnx.export(get_quantizer(name), (torch.randn(1, 4),), buffer, dynamo=False)
    graph = onnx.load_from_string(buffer.getvalue()).graph
    ops = [node.op_type for node in graph.node if node.op_type != "Constant"]
    assert ops == ["Sign", "Add", "Sign"]
