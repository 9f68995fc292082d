"""Bop variants: Bop2ndOrder ("Bop and Beyond") and the layer-wise normalised threshold match
independent NumPy references step by step, accept schedules, and train by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bnnexport.models import create_model
from bnnexport.optim.bop import Bop2ndOrder, BopNormalized
from bnnexport.optim.composite import OPTIMIZERS
from bnnexport.optim.schedules import LinearDecay, StepDecay


def _value(schedule, t):
    return schedule(t) if callable(schedule) else schedule


def numpy_bop2(w, gradients, gamma, threshold, sigma, eps=1e-10):
    """Suarez-Ramirez et al.: m, v exponential averages of g and g²; flip iff
    w·m/(sqrt(v)+eps) > τ. Written independently in float32 NumPy."""
    m, v, history = np.zeros_like(w), np.zeros_like(w), []
    for t, g in enumerate(gradients):
        gam, tau, sig = (np.float32(_value(s, t)) for s in (gamma, threshold, sigma))
        m = m * (np.float32(1) - gam) + gam * g
        v = v + sig * (g * g - v)
        flip = w * m / (np.sqrt(v) + np.float32(eps)) > tau
        w = np.where(flip, -w, w)
        history.append((w.copy(), int(flip.sum())))
    return history


def numpy_bop_normalized(w, gradients, gamma, threshold):
    """Flip iff w·m > τ·mean(|m|) over the whole tensor."""
    m, history = np.zeros_like(w), []
    for t, g in enumerate(gradients):
        gam, tau = np.float32(_value(gamma, t)), np.float32(_value(threshold, t))
        m = m * (np.float32(1) - gam) + gam * g
        flip = w * m > tau * np.abs(m).mean(dtype=np.float32)
        w = np.where(flip, -w, w)
        history.append((w.copy(), int(flip.sum())))
    return history


def _run(optimizer_cls, w, gradients, **kwargs):
    weight = nn.Parameter(torch.from_numpy(w.copy()))
    optimizer = optimizer_cls([weight], **kwargs)
    history = []
    for g in gradients:
        weight.grad = torch.from_numpy(g)
        optimizer.step()
        history.append((weight.detach().numpy().copy(), int(optimizer.state[weight]["flips"])))
    return history


def _stream(scales=(0.01,)):
    rng = np.random.default_rng(0)
    w = np.where(rng.standard_normal(600) >= 0, 1.0, -1.0).astype(np.float32)
    scale = np.repeat(np.asarray(scales, np.float32), 600 // len(scales))
    gradients = [rng.standard_normal(600).astype(np.float32) * scale for _ in range(40)]
    return w, gradients


def _compare(expected, actual, tolerate=0):
    total = 0
    for (w_ref, f_ref), (w_t, f_t) in zip(expected, actual, strict=True):
        # float32 rounding of the ratio may decide an entry within 1 ulp of τ differently
        assert int((w_ref != w_t).sum()) <= tolerate
        assert abs(f_ref - f_t) <= tolerate
        total += f_t
    assert total > 0  # the stream exercised flipping


@pytest.mark.parametrize(
    "gamma, threshold, sigma",
    [(1e-1, 1e-1, 1e-2), (1e-2, 0.0, 1e-1), (StepDecay(0.3, 0.1, 7), 0.2, 1e-2),
     (1e-1, LinearDecay(0.5, 0.0, 20), StepDecay(0.1, 0.5, 10))],
)  # fmt: skip
def test_bop2_matches_numpy_reference_step_by_step(gamma, threshold, sigma):
    w, gradients = _stream()
    expected = numpy_bop2(w, gradients, gamma, threshold, sigma)
    actual = _run(Bop2ndOrder, w, gradients, gamma=gamma, threshold=threshold, sigma=sigma)
    _compare(expected, actual)


@pytest.mark.parametrize(
    "gamma, threshold", [(1e-1, 1.0), (1e-2, 0.5), (StepDecay(0.3, 0.1, 7), LinearDecay(2, 0, 30))]
)
def test_bop_normalized_matches_numpy_reference_step_by_step(gamma, threshold):
    w, gradients = _stream()
    expected = numpy_bop_normalized(w, gradients, gamma, threshold)
    _compare(expected, _run(BopNormalized, w, gradients, gamma=gamma, threshold=threshold))


def test_bop2_threshold_is_scale_free_across_gradient_magnitudes():
    # Gradients 1000x apart: Bop2's m/sqrt(v) sees the same statistics, so both halves flip.
    w, gradients = _stream(scales=(1e-5, 1e-2))
    actual = _run(Bop2ndOrder, w, gradients, gamma=1e-1, threshold=0.3, sigma=1e-1)
    flipped = w != actual[-1][0]
    assert flipped[:300].any() and flipped[300:].any()


def test_bop_normalized_threshold_scales_with_the_layers_momentum():
    w, gradients = _stream()
    small = _run(BopNormalized, w, [g * 1e-4 for g in gradients], gamma=1e-1, threshold=1.0)
    large = _run(BopNormalized, w, gradients, gamma=1e-1, threshold=1.0)
    assert [f for _, f in small] == [f for _, f in large]  # scale-invariant flip decisions


def test_second_moment_and_schedules_survive_a_state_dict_round_trip():
    w, gradients = _stream()
    weight = nn.Parameter(torch.from_numpy(w.copy()))
    first = Bop2ndOrder([weight], gamma=StepDecay(0.1, 0.5, 5), threshold=0.1, sigma=1e-2)
    for g in gradients[:10]:
        weight.grad = torch.from_numpy(g)
        first.step()
    second = Bop2ndOrder([weight], gamma=1.0, threshold=0.0)
    second.load_state_dict(first.state_dict())
    assert second.steps == 10 and second.schedules["gamma"] == StepDecay(0.1, 0.5, 5)
    torch.testing.assert_close(
        second.state[weight]["second_moment"], first.state[weight]["second_moment"]
    )


@pytest.mark.parametrize("name", ["bop2", "bop-normalized"])
def test_variants_train_a_model_by_name_keeping_kernels_binary(name):
    torch.manual_seed(0)
    model = create_model("mnist-bnn")
    optimizer = OPTIMIZERS[name](model, gamma=1e-2, threshold=1e-3, lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 1, 28, 28)).logsumexp(1).sum().backward()
        optimizer.step()
    for weight in optimizer.optimizers["bop"].param_groups[0]["params"]:
        assert bool(((weight == 1) | (weight == -1)).all())
