"""Bop on any nn.Module: a hand-written BNN's kernels are found by the definition of a binary
layer verify and convert use, stay exactly ±1 after every step, flip by the paper's rule
(Helwegen et al. 2019, Algorithm 2), and the trained model converts."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F
from support.handwritten_bnn import KERNELS, hand_written_bnn
from torch import nn
from torch.utils.data import DataLoader

from bnnexport.datasets import load_dataset
from bnnexport.errors import ConfigError, NotBinaryError
from bnnexport.nn.discover import find_binary_kernels
from bnnexport.optim.bop import Bop
from bnnexport.optim.composite import bop_with_adam, latent_adam
from bnnexport.training.config import TrainConfig
from bnnexport.training.loop import evaluate

EXAMPLE = torch.zeros(1, 1, 28, 28)


@pytest.fixture
def one_thread():
    """One intra-op thread: on a shared 2-core machine two threads make a step 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_discovery_finds_the_kernels_binarized_in_forward_and_nothing_else():
    model = hand_written_bnn()
    kernels = find_binary_kernels(model, EXAMPLE)
    assert [k.name for k in kernels] == KERNELS and all(k.binarized for k in kernels)
    assert not bool((model.w1.abs() == 1).all())  # the model itself was left unchanged


def test_a_kernel_used_as_it_is_is_found_and_a_float_one_is_not():
    class Net(nn.Module):  # w used as it is behind a binarized input; head a float layer
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(8, 4, 3, 3))
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            y = F.conv2d(torch.where(x >= 0, 1.0, -1.0), self.w)
            return self.head(y.mean((2, 3)))

    kernels = find_binary_kernels(Net(), torch.zeros(1, 4, 6, 6))
    assert [(k.name, k.binarized) for k in kernels] == [("w", False)]


def test_no_binary_kernel_found_is_one_clear_error():
    with pytest.raises(ConfigError, match="no binary kernel in HandWrittenBNN .*example_input"):
        bop_with_adam(hand_written_bnn())
    with pytest.raises(ConfigError, match="no binary kernel in Linear found by tracing"):
        bop_with_adam(nn.Linear(4, 2), example_input=torch.zeros(1, 4))
    with pytest.raises(ConfigError, match="has no parameter 'w9'"):
        bop_with_adam(hand_written_bnn(), binary=["w1", "w9"])


def test_bop_refuses_real_weights_unless_told_to_take_their_sign():
    model = hand_written_bnn()
    with pytest.raises(NotBinaryError, match=r"w1 has 2304 of 2304 values that are not ±1"):
        bop_with_adam(model, example_input=EXAMPLE)
    with pytest.raises(NotBinaryError, match="parameter 0 has 1 of 3 values"):
        Bop([nn.Parameter(torch.tensor([1.0, 0.5, -1.0]))])
    with torch.no_grad():
        model.w2[0, 0, 0, 0] = 0.0  # a tie goes to +1
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        optimizer = bop_with_adam(model, binary=lambda name, p: name in KERNELS, init_sign=True)
    assert "set 3 binary kernel(s) to sign(w), ties to +1: w1, w2, fc" in str(said[0].message)
    assert list(optimizer.binary_kernels) == KERNELS and model.w2[0, 0, 0, 0] == 1.0
    assert all(bool((p.abs() == 1).all()) for p in optimizer.binary_kernels.values())


def test_latent_adam_clips_the_kernels_it_finds_and_they_start_glorot_uniform():
    from bnnexport.nn.layers import init_latent_weights

    model = hand_written_bnn()
    optimizer = latent_adam(model, example_input=EXAMPLE)
    latent = optimizer.optimizers["latent"].param_groups[0]["params"]
    assert [id(p) for p in latent] == [id(p) for p in optimizer.binary_kernels.values()]
    init_latent_weights(model, kernels=optimizer.binary_kernels)
    bound = (6.0 / (16 * 9 + 16 * 9)) ** 0.5  # w1: fan_in 16·3·3, fan_out 16·3·3
    assert 0.9 * bound < float(model.w1.abs().max()) <= bound
    assert float(model.fc.abs().max()) <= (6.0 / (model.fc.shape[1] + 10)) ** 0.5


def test_one_set_of_defaults_in_python_and_the_cli():
    from bnnexport.cli.train import train_command

    python = inspect.signature(bop_with_adam).parameters
    defaults = {key: python[key].default for key in ("gamma", "threshold", "lr")}
    config = TrainConfig()
    assert defaults == {"gamma": config.gamma, "threshold": config.threshold, "lr": config.lr}
    bop = inspect.signature(Bop).parameters
    assert (bop["gamma"].default, bop["threshold"].default) == (config.gamma, config.threshold)
    assert inspect.signature(latent_adam).parameters["lr"].default == config.lr
    cli = {p.name: p.default for p in train_command.params if p.name in defaults}
    assert {key: float(value) for key, value in cli.items()} == defaults


def _momentum(bop: Bop, kernel: torch.Tensor) -> torch.Tensor:
    """Bop's m for `kernel` now (0 before its first step)."""
    state = bop.state.get(kernel, {})
    return state["momentum"].clone() if "momentum" in state else torch.zeros_like(kernel)


def _train_and_check(model: nn.Module, steps: int) -> tuple[torch.optim.Optimizer, int]:
    """Bop on `model` for `steps` mnist5k batches; after every step each kernel is ±1 and the
    flips are exactly the paper's: m <- (1-γ) m + γ g, then w flips iff w·m > τ."""
    optimizer = bop_with_adam(model, example_input=EXAMPLE, init_sign=True)
    bop = optimizer.optimizers["bop"]
    gamma, tau = bop.param_groups[0]["gamma"], bop.param_groups[0]["threshold"]
    data = load_dataset("mnist5k")
    loader = DataLoader(data.train, batch_size=50, shuffle=True,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    flips, step = 0, 0
    while step < steps:
        for inputs, labels in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), labels).backward()
            before = {n: p.detach().clone() for n, p in optimizer.binary_kernels.items()}
            momentum = {n: _momentum(bop, p) for n, p in optimizer.binary_kernels.items()}
            optimizer.step()
            for name, kernel in optimizer.binary_kernels.items():
                assert bool((kernel.abs() == 1).all()), f"{name} left ±1 at step {step}"
                m = bop.state[kernel]["momentum"]
                expected = momentum[name] * (1 - gamma) + kernel.grad * gamma
                torch.testing.assert_close(m, expected, rtol=1e-6, atol=1e-12)
                flipped = kernel != before[name]
                assert torch.equal(flipped, before[name] * m > tau), f"{name} at step {step}"
                flips += int(flipped.sum())
            step += 1
            if step == steps:
                break
    return optimizer, flips


@pytest.mark.slow
def test_bop_trains_a_hand_written_bnn_by_the_papers_rule(one_thread):
    torch.manual_seed(0)
    model = hand_written_bnn()
    _, flips = _train_and_check(model, steps=40)
    assert flips > 0  # the rule was exercised, not only the "no flip" branch


@pytest.mark.slow
@pytest.mark.long
def test_bop_trains_a_hand_written_bnn_for_hundreds_of_steps_and_it_converts(one_thread, tmp_path):
    from bnnexport import convert_module
    from bnnexport.stages.verify import verify_onnx

    torch.manual_seed(0)
    model = hand_written_bnn()
    _, flips = _train_and_check(model, steps=300)
    data = load_dataset("mnist5k")
    accuracy = evaluate(model, data.test)
    assert flips > 0 and accuracy > 0.5, accuracy  # chance is 0.1
    samples = torch.stack([data.test[i][0] for i in range(32)])
    report = convert_module(model, samples[:1], out=tmp_path / "hand-arm64.tflite",
                            samples=samples, progress=False)  # fmt: skip
    assert report.binary_layers == report.lce_bconv2d == len(KERNELS)
    assert verify_onnx(tmp_path / "hand-arm64.onnx").strict
