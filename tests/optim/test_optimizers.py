"""Bop is the paper's Algorithm 2, exactly; CaseOptimizer assigns every parameter once."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bnnexport.nn.layers import BinaryConv2d, BinaryLinear, binary_parameters, set_latent
from bnnexport.nn.quantizers import SteSign
from bnnexport.optim.bop import HYPERPARAMETER_RULES, Bop, Bop2ndOrder
from bnnexport.optim.composite import CaseOptimizer, bop_with_adam
from bnnexport.optim.schedules import LinearDecay, StepDecay, as_schedule
from bnnexport.training.flips import FlipCounter, flip_rate


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


def numpy_bop_groups(weights, gradients, settings):
    """Algorithm 2 run independently per group: settings[i] = (γ, τ) of group i, numbers or
    callables of the step."""
    return [numpy_bop(w, [g[i] for g in gradients], *settings[i]) for i, w in enumerate(weights)]


@pytest.mark.parametrize(
    "global_gamma",
    [1e-4, StepDecay(1e-2, 0.1, 10)],  # a global schedule must not reach the group that set its own
)
def test_each_param_group_keeps_its_own_gamma_and_threshold_step_by_step(global_gamma):
    rng = np.random.default_rng(2)
    sizes = (300, 200, 100)
    weights = [np.where(rng.standard_normal(n) >= 0, 1.0, -1.0).astype(np.float32) for n in sizes]
    gradients = [[rng.standard_normal(n).astype(np.float32) * 1e-2 for n in sizes]
                 for _ in range(25)]  # fmt: skip
    params = [nn.Parameter(torch.from_numpy(w.copy())) for w in weights]
    optimizer = Bop(
        [{"params": [params[0]], "gamma": 1e-1, "threshold": 0.0},  # the example
         {"params": [params[1]], "threshold": LinearDecay(1e-3, 0.0, 20)},  # own τ, global γ
         {"params": [params[2]]}],
        gamma=global_gamma, threshold=1e-8,
    )  # fmt: skip
    expected = numpy_bop_groups(
        weights, gradients, [(1e-1, 0.0), (global_gamma, LinearDecay(1e-3, 0.0, 20)),
                             (global_gamma, 1e-8)]
    )  # fmt: skip
    flips = [0, 0, 0]
    for t, grads in enumerate(gradients):
        for p, g in zip(params, grads, strict=True):
            p.grad = torch.from_numpy(g)
        optimizer.step()
        for i, p in enumerate(params):
            w_ref, m_ref, f_ref = expected[i][t]
            np.testing.assert_array_equal(p.detach().numpy(), w_ref)
            np.testing.assert_allclose(optimizer.state[p]["momentum"].numpy(), m_ref, rtol=1e-6,
                                       atol=1e-12)  # fmt: skip
            assert int(optimizer.state[p]["flips"]) == f_ref
            flips[i] += f_ref
    assert all(flips)  # every group flipped at some point
    assert (optimizer.param_groups[0]["gamma"], optimizer.param_groups[0]["threshold"]) == (0.1, 0)
    assert [g["steps"] for g in optimizer.param_groups] == [25, 25, 25]


def test_a_group_with_an_out_of_range_gamma_is_refused():
    with pytest.raises(ValueError, match="gamma must be in"):
        Bop([{"params": [nn.Parameter(torch.ones(2))], "gamma": 2.0}])


def _model():
    return nn.Sequential(BinaryLinear(4, 4), BinaryLinear(4, 4), nn.Linear(4, 2))


def test_per_group_settings_and_step_counts_round_trip_through_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = _model()
    optimizer = bop_with_adam(
        model, gamma="step:1e-2,0.1,3", threshold=1e-6, lr=1e-2,
        groups=[{"params": [model[0].weight], "gamma": 1e-1, "threshold": "linear:1e-3,0,10"}],
    )  # fmt: skip
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    optimizer.zero_grad()
    torch.save(optimizer.state_dict(), tmp_path / "opt.pt")
    restored_model = _model()
    restored = bop_with_adam(restored_model, groups=[{"params": [restored_model[0].weight]}])
    restored.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    bop = restored.optimizers["bop"]
    own, rest = bop.param_groups
    assert own["schedules"] == {"gamma": as_schedule(1e-1), "threshold": LinearDecay(1e-3, 0, 10)}
    assert rest["schedules"] == {} and bop.schedules["gamma"] == StepDecay(1e-2, 0.1, 3)
    assert own["steps"] == rest["steps"] == bop.steps == 4
    assert restored.param_groups[0] is own  # the composite shares the restored groups
    # the next step continues each group's own schedule where it stopped
    restored_model.load_state_dict(model.state_dict())
    for m in (model, restored_model):
        m(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    restored.step()
    assert restored.hyperparameters() == optimizer.hyperparameters()
    assert restored.hyperparameters()["bop.1.gamma"] == pytest.approx(1e-3)  # step 4 of x0.1/3
    assert restored.hyperparameters()["bop.gamma"] == 1e-1
    for a, b in zip(model.parameters(), restored_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_torch_lr_scheduler_on_the_composite_changes_adams_lr_and_not_bops_gamma():
    model = _model()
    optimizer = bop_with_adam(model, gamma=1e-3, threshold=1e-6, lr=1e-2)
    assert isinstance(optimizer, torch.optim.Optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1)
    for _ in range(4):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    assert optimizer.optimizers["adam"].param_groups[0]["lr"] == pytest.approx(1e-4)
    assert optimizer.optimizers["bop"].param_groups[0]["gamma"] == 1e-3
    assert optimizer.hyperparameters() == pytest.approx(
        {"bop.gamma": 1e-3, "bop.threshold": 1e-6, "adam.lr": 1e-4}
    )


def test_a_torch_lr_scheduler_on_the_adam_part_drives_its_lr():
    model = _model()
    optimizer = bop_with_adam(model, lr=1e-2)
    torch.optim.lr_scheduler.LambdaLR(optimizer.optimizers["adam"], lambda epoch: 0.5)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    assert optimizer.hyperparameters()["adam.lr"] == pytest.approx(5e-3)


def test_a_scheduled_lr_refuses_a_torch_scheduler_instead_of_fighting_it():
    model = _model()
    optimizer = bop_with_adam(model, lr="linear:1e-2,0,100")
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    model(torch.randn(2, 4)).sum().backward()
    with pytest.raises(ValueError, match="give lr as a number"):
        optimizer.step()


def test_composite_runs_step_hooks_and_takes_new_groups_by_case():
    model = _model()
    optimizer = bop_with_adam(model)
    calls = []
    optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append(opt))
    extra = nn.Parameter(torch.zeros(3))
    optimizer.add_param_group({"case": "adam", "params": [extra], "lr": 0.5})
    assert optimizer.param_groups[-1] is optimizer.optimizers["adam"].param_groups[-1]
    extra.grad = torch.ones(3)
    optimizer.step()
    assert calls == [optimizer] and torch.allclose(extra, torch.full((3,), -0.5))
    with pytest.raises(ValueError, match="needs 'case'"):
        optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})


def test_set_schedule_reaches_groups_without_their_own_only():
    model = _model()
    optimizer = bop_with_adam(
        model, gamma=1e-3, groups=[{"params": [model[0].weight], "gamma": 0.1}]
    )
    optimizer.set_schedule("gamma", "step:1e-2,0.1,5")  # what a resumed run with --gamma does
    optimizer.set_schedule("lr", 5e-3)
    values = optimizer.hyperparameters()
    assert (values["bop.gamma"], values["bop.1.gamma"], values["adam.lr"]) == (0.1, 1e-2, 5e-3)


@pytest.mark.parametrize("make", [
    lambda ps: Bop(ps, gamma=1e-3),
    lambda ps: Bop2ndOrder(ps, gamma=1e-3, sigma=1e-2),
])  # fmt: skip
def test_a_group_added_later_takes_the_optimizers_current_settings(make):
    first, later = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    optimizer = make([first])
    optimizer.set_schedule("gamma", 1e-1)
    optimizer.add_param_group({"params": [later]})
    assert [group["gamma"] for group in optimizer.param_groups] == [1e-1, 1e-1]


def test_a_group_the_composite_adds_later_takes_its_parts_current_settings():
    model = _model()
    optimizer = bop_with_adam(model, gamma=1e-3, lr=1e-2)
    optimizer.set_schedule("gamma", 1e-1)
    optimizer.set_schedule("lr", 5e-3)
    optimizer.add_param_group({"case": "bop", "params": [torch.ones(3, requires_grad=True)]})
    optimizer.add_param_group({"case": "adam", "params": [torch.zeros(3, requires_grad=True)]})
    assert optimizer.optimizers["bop"].param_groups[-1]["gamma"] == 1e-1
    assert optimizer.optimizers["adam"].param_groups[-1]["lr"] == 5e-3


def test_a_group_added_later_goes_on_with_the_optimizer_wide_schedule_where_it_is():
    first, later = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    optimizer = Bop([first], gamma="step:1e-1,0.1,2")
    for _ in range(2):
        first.grad = torch.zeros(3)
        optimizer.step()
    optimizer.add_param_group({"params": [later]})
    first.grad, later.grad = torch.zeros(3), torch.zeros(3)
    optimizer.step()
    assert [group["gamma"] for group in optimizer.param_groups] == [pytest.approx(1e-2)] * 2


@pytest.mark.parametrize("gamma,step", [("linear:1e-2,0,10", 10), ("step:0.5,3,4", 4)])
def test_a_schedule_that_leaves_its_range_is_refused_naming_the_step(gamma, step):
    with pytest.raises(ValueError, match=f"gamma must be in \\(0, 1\\].* at step {step} "):
        Bop([torch.ones(3, requires_grad=True)], gamma=gamma)
    optimizer = Bop([torch.ones(3, requires_grad=True)])
    with pytest.raises(ValueError, match=f"at step {step} "):
        optimizer.set_schedule("gamma", gamma)
    assert optimizer.param_groups[0]["gamma"] == 1e-3  # refused: nothing changed


def _steps(optimizer: Bop, weight: torch.Tensor, count: int) -> None:
    for _ in range(count):
        weight.grad = torch.full_like(weight, 1e-3)
        optimizer.step()


def test_a_schedule_that_leaves_its_range_after_its_own_course_is_refused_at_that_step():
    """A step decay by 2 from 0.5 passes its own course (steps 0-1) and reaches γ = 2 at step
    2, as `train --gamma step:0.5,2,1` is refused at step 2 of the run's: the step is refused
    before it changes a weight or a moving average."""
    weight = torch.ones(3, requires_grad=True)
    optimizer = Bop([weight], gamma="step:0.5,2,1", threshold=0.0)
    _steps(optimizer, weight, 2)
    momentum, before = optimizer.state[weight]["momentum"].clone(), weight.detach().clone()
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\].*, got 2 at step 2 of"):
        _steps(optimizer, weight, 1)
    assert torch.equal(optimizer.state[weight]["momentum"], momentum)
    assert torch.equal(weight, before) and optimizer.steps == 2


def test_a_gamma_that_underflows_to_zero_in_float32_is_refused_naming_the_step():
    """1e-303 is a Python float above 0, and 0 in the float32 Bop computes m in (m would stop)."""
    with pytest.raises(ValueError, match=r"above 0 in float32\), got 1e-303 at step 1 of"):
        Bop([torch.ones(3, requires_grad=True)], gamma="step:1e-3,1e-300,1")


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), "linear:1e-6,inf,10"])
def test_a_threshold_that_is_not_finite_is_refused(threshold):
    with pytest.raises(ValueError, match="threshold must be a finite number >= 0"):
        Bop([torch.ones(3, requires_grad=True)], threshold=threshold)


def test_the_optimizers_and_train_refuse_by_the_same_rules():
    from bnnexport.errors import ConfigError
    from bnnexport.optim.composite import all_hyperparameters
    from bnnexport.training.config import TrainConfig, check_schedules

    declared = all_hyperparameters()  # what check_schedules checks a TrainConfig by
    for key, (ok, rule) in HYPERPARAMETER_RULES.items():
        assert (declared[key].ok, declared[key].rule) == (ok, rule)
    with pytest.raises(ConfigError, match=r"--gamma step:1e-3,1e-300,1: 1e-303 at step 1,"):
        check_schedules(TrainConfig(gamma="step:1e-3,1e-300,1"))


def test_one_cycle_lr_with_its_defaults_cycles_adam_and_leaves_bop_alone():
    model = _model()
    optimizer = bop_with_adam(model, gamma=1e-3, threshold=1e-6, lr=1e-2)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=10)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    adam = optimizer.optimizers["adam"].param_groups[0]
    assert 4e-4 < adam["lr"] < 1e-2 and 0.85 <= adam["betas"][0] < 0.95  # both cycling
    assert optimizer.hyperparameters()["bop.gamma"] == 1e-3
