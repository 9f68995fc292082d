"""bnnexport.nn.sign_trace: every way papers' code binarizes an activation is found in one traced
forward pass, and a second pass imposes chosen signs exactly where the layer reads them, the
rest of the model (a float shortcut reading the same tensor) untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.client_nets import index_put_sign
from support.converter_nets import PlainSign
from support.own_models import approx_sign
from torch import nn

from bnnexport.errors import FidelityError
from bnnexport.nn.sign_trace import SignReplay, trace_binarizations

IDIOMS = {
    "torch.sign": torch.sign,
    "where": lambda x: torch.where(x >= 0, 1.0, -1.0),
    "cast-compare": lambda x: (x >= 0).float() * 2 - 1,
    "sign-add-sign": lambda x: torch.sign(torch.sign(x) + 0.1),
    "autograd.Function": PlainSign.apply,
    "detach trick": approx_sign,
    "bitorch": lambda x: torch.where(torch.sign(x) == 0, torch.ones_like(x), torch.sign(x)),
    "index-put": index_put_sign,
    "hardtanh then sign": lambda x: torch.sign(F.hardtanh(x)),
    "x > 0": lambda x: torch.where(x > 0, 1.0, -1.0),
}


class Identity1x1(nn.Module):
    """stem -> BatchNorm -> binarize -> identity 1x1 conv, plus the stem's output as a float
    shortcut: the output is the binarized tensor plus what the shortcut carries."""

    def __init__(self, binarize, shortcut: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4).eval()
        self.eye = nn.Parameter(torch.eye(4).reshape(4, 4, 1, 1))
        self.binarize, self.shortcut = binarize, shortcut

    def forward(self, x):
        y = self.bn(self.stem(x))
        out = F.conv2d(self.binarize(y), self.eye)
        return out + 100 * y if self.shortcut else out


X = torch.randn(1, 1, 6, 6, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("idiom", sorted(IDIOMS))
def test_each_idiom_is_one_binarization_of_the_tensor_it_reads(idiom):
    traced = trace_binarizations(Identity1x1(IDIOMS[idiom]), X)
    assert traced.shapes == [(4, 6, 6)] and traced.unresolved == []


@pytest.mark.parametrize("idiom", sorted(IDIOMS))
def test_the_replay_reads_the_source_and_the_layer_sees_exactly_the_imposed_signs(idiom):
    model = Identity1x1(IDIOMS[idiom])
    traced = trace_binarizations(model, X)
    signs = np.where(np.random.default_rng(2).random((4, 6, 6)) < 0.5, -1.0, 1.0)
    replay = SignReplay(traced, [signs.astype(np.float32)])
    with torch.no_grad(), replay:
        out = model(X)
    # the identity conv shows what it was fed (the detach trick: ±1 up to the rounding of
    # (s - p) + p)
    assert np.abs(out[0].numpy() - signs).max() <= 1e-6
    with torch.no_grad():
        source = model.bn(model.stem(X))[0].numpy()
    assert np.array_equal(replay.values()[0], source)


def test_imposing_signs_leaves_a_float_shortcut_reading_the_same_tensor_as_it_is():
    model = Identity1x1(IDIOMS["where"], shortcut=True)
    traced = trace_binarizations(model, X)
    with torch.no_grad():
        own = model(X)
        y = model.bn(model.stem(X))
    flipped = -np.where(y[0].numpy() >= 0, 1.0, -1.0).astype(np.float32)
    with torch.no_grad(), SignReplay(traced, [flipped]):
        imposed = model(X)
    assert torch.allclose(imposed - 100 * y, torch.from_numpy(flipped)[None])
    assert torch.allclose(own - 100 * y, -torch.from_numpy(flipped)[None])


class Mixed(nn.Module):
    """A latent kernel binarized in forward, a LeakyReLU-style where(x > 0, x, 0.1 x) feeding a
    float conv, then a real activation binarization feeding a binary linear head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(1, 4, 3)
        self.latent = nn.Parameter(torch.randn(4, 4, 3, 3))
        self.float_conv = nn.Conv2d(4, 4, 1)
        self.head = nn.Parameter(torch.randn(3, 4 * 2 * 2))

    def forward(self, x):
        x = self.stem(x)
        x = F.conv2d(x, torch.sign(self.latent))  # a float input: no binary layer
        x = self.float_conv(torch.where(x > 0, x, 0.1 * x))
        return F.linear(torch.sign(x.flatten(1)), torch.sign(self.head))


def test_kernel_binarizations_and_comparisons_in_float_code_are_not_activation_binarizations():
    traced = trace_binarizations(Mixed(), X)
    assert traced.shapes == [(16,)]  # the head's flattened input, nothing else
    assert [[o.function for o in origins] for origins in traced.origins] == [["sign"]]


class TakesAnotherPath(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3)
        self.w = nn.Parameter(torch.ones(4, 4, 1, 1))
        self.small = nn.Parameter(torch.ones(4, 4 * 2 * 2))

    def forward(self, x):
        x = self.stem(x)
        if float(x.mean()) > 0:  # data-dependent control flow
            x = F.max_pool2d(x, 2)
        return F.conv2d(torch.sign(x), self.w).flatten(1)


def test_a_pass_that_takes_another_path_than_the_traced_one_is_refused_not_matched_by_guess():
    model = TakesAnotherPath()
    with torch.no_grad():
        model.stem.bias.fill_(5.0)
        traced = trace_binarizations(model, X)
        model.stem.bias.fill_(-5.0)
        with pytest.raises(FidelityError, match="reads another tensor than its traced pass"):
            with SignReplay(traced, None):
                model(X)
