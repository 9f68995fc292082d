"""Quantizers: forward is sign with sign(0) = +1; each has its documented pseudo-gradient."""

import io

import onnx
import pytest
import torch

from bnnexport.nn.quantizers import get_quantizer, list_quantizers


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


def test_swish_sign_gradient_is_the_derivative_of_the_sign_swish_function():
    """The backward pass is d/dx of SignSwish (BNN+), 2 sigmoid(bx) (1 + bx (1 - sigmoid(bx))) - 1
    with b = 5, checked against central finite differences of that function."""
    beta, h = 5.0, 1e-6
    points = [-0.9, -0.4, -0.05, 0.0, 0.1, 0.7, 1.5]
    x = torch.tensor(points, requires_grad=True)
    get_quantizer("swish_sign")(x).sum().backward()

    def sign_swish(v: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(beta * v)
        return 2 * s * (1 + beta * v * (1 - s)) - 1

    at = torch.tensor(points, dtype=torch.float64)
    numeric = (sign_swish(at + h) - sign_swish(at - h)) / (2 * h)
    assert torch.allclose(x.grad.double(), numeric, rtol=1e-4, atol=1e-5)
    assert x.grad[3] == pytest.approx(beta)  # the peak at 0


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
