"""Bop is the paper's Algorithm 2, exactly; CaseOptimizer assigns every parameter once."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bnnexport.layers import BinaryConv2d, BinaryLinear, binary_parameters, set_latent
from bnnexport.optimizers import Bop, CaseOptimizer, FlipCounter, bop_with_adam, flip_rate
from bnnexport.quantizers import SteSign
from bnnexport.schedules import LinearDecay, StepDecay


def numpy_bop(w, gradients, gamma, threshold):
    """Reference: Helwegen et al. 2019, Algorithm 2, written independently in NumPy (float32)."""
    m = np.zeros_like(w)
    history = []
    for t, g in enumerate(gradients):
        gamma_t = gamma(t) if callable(gamma) else gamma
        tau_t = threshold(t) if callable(threshold) else threshold
        m = m * np.float32(1.0 - gamma_t) + g * np.float32(gamma_t)
        flip = (np.abs(m) > tau_t) & (np.sign(m) == np.sign(w))
        w = np.where(flip, -w, w)
        history.append((w.copy(), m.copy(), int(flip.sum())))
    return history


def run_torch_bop(w, gradients, gamma, threshold):
    weight = nn.Parameter(torch.from_numpy(w.copy()))
    optimizer = Bop([weight], gamma=gamma, threshold=threshold)
    history = []
    for g in gradients:
        weight.grad = torch.from_numpy(g)
        optimizer.step()
        state = optimizer.state[weight]
        history.append(
            (weight.detach().numpy().copy(), state["momentum"].numpy().copy(), int(state["flips"]))
        )
    return history


@pytest.mark.parametrize(
    "gamma,threshold",
    [(1e-1, 1e-3), (1e-2, 0.0), (StepDecay(0.3, 0.1, 7), 1e-4), (LinearDecay(0.5, 0.01, 20), 1e-3)],
)
def test_bop_matches_numpy_algorithm_2_step_by_step(gamma, threshold):
    rng = np.random.default_rng(0)
    w = np.where(rng.standard_normal(500) >= 0, 1.0, -1.0).astype(np.float32)
    gradients = [rng.standard_normal(500).astype(np.float32) * 0.01 for _ in range(30)]
    expected = numpy_bop(w, gradients, gamma, threshold)
    actual = run_torch_bop(w, gradients, gamma, threshold)
    total_flips = 0
    for (w_ref, m_ref, f_ref), (w_t, m_t, f_t) in zip(expected, actual, strict=True):
        np.testing.assert_allclose(m_t, m_ref, rtol=1e-6, atol=1e-12)
        np.testing.assert_array_equal(w_t, w_ref)
        assert f_t == f_ref
        total_flips += f_t
    assert total_flips > 0  # the stream exercised flipping at all


def test_weights_stay_exactly_plus_minus_one_after_every_step():
    layer = BinaryConv2d(32, 16, 3, padding=1)
    optimizer = Bop([layer.weight], gamma=0.5, threshold=0.0)
    for _ in range(20):
        layer(torch.randn(2, 32, 6, 6)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        assert bool(((layer.weight == 1) | (layer.weight == -1)).all())


def test_momentum_exactly_at_threshold_does_not_flip():
    tau = 0.25
    w = torch.tensor([1.0, -1.0, 1.0, -1.0])
    weight = nn.Parameter(w.clone())
    optimizer = Bop([weight], gamma=1.0, threshold=tau)
    # gamma = 1 makes m = g, so w * m == tau exactly for the first two entries.
    weight.grad = torch.tensor([tau, -tau, 2 * tau, -2 * tau])
    optimizer.step()
    assert weight.tolist() == [1.0, -1.0, -1.0, 1.0]


def _flips_on_stream(gamma, threshold, steps=50):
    rng = np.random.default_rng(1)
    w = np.where(rng.standard_normal(2000) >= 0, 1.0, -1.0).astype(np.float32)
    gradients = [rng.standard_normal(2000).astype(np.float32) * 1e-3 for _ in range(steps)]
    return sum(f for _, _, f in run_torch_bop(w, gradients, gamma, threshold))


def test_higher_gamma_gives_more_flips():
    assert _flips_on_stream(1e-2, 1e-6) > _flips_on_stream(1e-3, 1e-6) > 0


def test_lower_threshold_gives_more_flips():
    assert _flips_on_stream(1e-2, 1e-6) > _flips_on_stream(1e-2, 1e-5) > 0


def test_theorem_1_scaling_lr_and_latent_weights_gives_identical_binary_weights():
    """Paper, Theorem 1: latent SGD with the identity STE is invariant to scaling both by C."""

    def train(scale):
        torch.manual_seed(0)
        model = nn.Sequential(
            BinaryConv2d(3, 8, 3, input_quantizer=None), nn.Flatten(), BinaryLinear(8 * 6 * 6, 4)
        )
        set_latent(model, True, kernel_quantizer=SteSign(clip_value=float("inf")))
        for p in binary_parameters(model):
            p.data.normal_(0, 0.1).mul_(scale)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * scale)
        data = torch.Generator().manual_seed(1)
        history = []
        for _ in range(50):
            x = torch.randn(8, 3, 8, 8, generator=data)
            y = torch.randint(0, 4, (8,), generator=data)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            history.append([torch.sign(p.detach()).clone() for p in binary_parameters(model)])
        return history

    reference, scaled = train(1.0), train(8.0)
    changed = False
    for ref_step, scaled_step in zip(reference, scaled, strict=True):
        for a, b in zip(ref_step, scaled_step, strict=True):
            assert torch.equal(a, b)
        changed |= not torch.equal(ref_step[0], reference[0][0])
    assert changed  # the binary weights did move over the 50 steps


def test_case_optimizer_refuses_a_parameter_claimed_twice():
    model = nn.Sequential(BinaryLinear(4, 4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="claimed by a and b"):
        CaseOptimizer(
            model,
            [
                ("a", lambda n, p: True, lambda ps: Bop(ps)),
                ("b", lambda n, p: n.startswith("0"), torch.optim.Adam),
            ],
        )


def test_case_optimizer_refuses_an_unclaimed_parameter():
    model = nn.Sequential(BinaryLinear(4, 4), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="'1.weight' is claimed by no optimizer"):
        CaseOptimizer(model, [("bop", lambda n, p: n == "0.weight", lambda ps: Bop(ps))])


def test_bop_with_adam_gives_binary_kernels_to_bop_and_the_rest_to_adam():
    model = nn.Sequential(BinaryLinear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    optimizer = bop_with_adam(model)
    bop_params = optimizer.optimizers["bop"].param_groups[0]["params"]
    adam_params = optimizer.optimizers["adam"].param_groups[0]["params"]
    assert [id(p) for p in bop_params] == [id(model[0].weight)]
    assert len(adam_params) == 4  # BN weight, BN bias, Linear weight, Linear bias


def test_optimizer_state_round_trips_with_its_schedules():
    model = nn.Sequential(BinaryLinear(4, 4), nn.Linear(4, 2))
    optimizer = bop_with_adam(model, gamma="step:1e-2,0.1,3", threshold=1e-6, lr="linear:1e-2,0,10")
    for _ in range(4):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    state = optimizer.state_dict()
    restored = bop_with_adam(nn.Sequential(BinaryLinear(4, 4), nn.Linear(4, 2)))
    restored.load_state_dict(state)
    assert restored.optimizers["bop"].steps == 4
    assert restored.optimizers["bop"].schedules["gamma"] == StepDecay(1e-2, 0.1, 3)
    assert restored.optimizers["adam"].schedules["lr"] == LinearDecay(1e-2, 0.0, 10)


def test_flip_rate_is_log_of_fraction_plus_e_minus_9():
    assert flip_rate(0, 100) == pytest.approx(-9.0)
    assert flip_rate(50, 100) == pytest.approx(np.log(0.5 + np.exp(-9)))


def test_flip_counter_counts_the_flips_bop_reports():
    layer = BinaryLinear(16, 8)
    model = nn.Sequential(layer)
    optimizer = Bop([layer.weight], gamma=1.0, threshold=0.0)
    counter = FlipCounter(model)
    layer(torch.randn(4, 16)).sum().backward()
    counter.before_step()
    optimizer.step()
    flips, total = counter.after_step()["0"]
    assert flips == int(optimizer.state[layer.weight]["flips"]) and total == 128
