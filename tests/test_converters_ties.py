"""converters.ties: a sign tie explains a disagreement; a flipped non-tie or kernel bit never does.

The other runtime is simulated in torch: the same net with one binarization's decision at one
activation taken the other way. A tie is made exactly: a BatchNorm bias is shifted so that one
pre-sign value of sample 0 is zero up to rounding.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from converter_nets import binary_conv, binary_linear, export, trained_bn
from onnx import numpy_helper

from converters.patterns import find_binary_layers
from converters.ties import MAX_CANDIDATES, MAX_STEPS, TIE_RTOL, TieProbe, explain_by_ties
from converters.validate import compare, run_onnx

SHAPE = (1, 3, 12, 12)


class Binarize(nn.Module):
    """sign with sign(0) = +1; `force` = (flat index in sample 0, sign) overrides one decision."""

    def __init__(self):
        super().__init__()
        self.force: tuple[int, float] | None = None

    def forward(self, x):
        if self.force is not None:
            index, sign = self.force
            x = x.clone()
            x[0].view(-1)[index] = sign
        return torch.sign(torch.sign(x) + 0.1)


class Net(nn.Module):
    """float conv -> BN -> [sign -> ±1 conv -> BN] x2 with a real-valued shortcut -> ±1 dense."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 16, 3, padding=1)
        self.bn0 = trained_bn(nn.BatchNorm2d(16), seed=1)
        self.signs = nn.ModuleList([Binarize() for _ in range(3)])
        self.conv1 = binary_conv(16, 16, 3, padding=1)
        self.bn1 = trained_bn(nn.BatchNorm2d(16), seed=2)
        self.conv2 = binary_conv(16, 16, 3, padding=1)
        self.bn2 = trained_bn(nn.BatchNorm2d(16), seed=3)
        self.head = binary_linear(16 * 12 * 12, 10)

    def forward(self, x):
        x = self.bn0(self.first(x))
        x = x + self.bn1(self.conv1(self.signs[0](x)))  # Bi-Real style shortcut
        x = x + self.bn2(self.conv2(self.signs[1](x)))
        return self.head(self.signs[2](torch.flatten(x, 1)))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(net, onnx path, inputs, ORT outputs) with an exact tie at binarization 1, sample 0."""
    torch.manual_seed(0)
    net = Net().eval()
    x = np.random.default_rng(0).standard_normal((6, *SHAPE[1:])).astype(np.float32)
    captured = {}
    hook = net.signs[1].register_forward_pre_hook(lambda m, a: captured.update(x=a[0]))
    with torch.no_grad():
        net(torch.from_numpy(x[:1]))
    hook.remove()
    channel, row, col = 5, 6, 7
    with torch.no_grad():
        net.bn1.bias -= captured["x"][0, channel, row, col]
    path = export(net, SHAPE, tmp_path_factory.mktemp("ties") / "net.onnx")
    tie = np.ravel_multi_index((channel, row, col), (16, 12, 12))
    return net, path, x, run_onnx(path, x), int(tie)


def _with_forced(net, x, layer, index, sign):
    net.signs[layer].force = (index, sign)
    try:
        with torch.no_grad():
            return net(torch.from_numpy(x)).numpy()
    finally:
        net.signs[layer].force = None


def _other_decision(setup):
    """The net's outputs with the tie decided against ONNX Runtime's own decision."""
    net, path, x, ort, tie = setup
    _, sources = TieProbe(path).run(x[0], {})
    own = 1.0 if sources[1].reshape(-1)[tie] >= 0 else -1.0
    assert abs(sources[1].reshape(-1)[tie]) <= TIE_RTOL * np.abs(sources[1]).max()
    return _with_forced(net, x, 1, tie, -own)


def test_a_tie_decided_the_other_way_is_explained(setup):
    _, path, x, ort, _ = setup
    other = _other_decision(setup)
    plain = compare(ort, other)
    assert plain.max_abs_diff > 100 * plain.tolerance  # the tie matters: the check fails plainly
    resolved, report = explain_by_ties(path, x, ort, other)
    assert report.failing == 1 and report.explained == 1 and report.rows == [0]
    assert report.positions == 1 and report.largest_tie <= TIE_RTOL
    after = compare(resolved, other)
    assert after.argmax_agreement == 1.0 and after.max_abs_diff <= after.tolerance


def test_a_flipped_activation_far_from_zero_is_not_explained(setup):
    net, path, x, ort, _ = setup
    _, sources = TieProbe(path).run(x[0], {})
    far = int(np.abs(sources[1]).argmax())
    own = 1.0 if sources[1].reshape(-1)[far] >= 0 else -1.0
    other = _with_forced(net, x, 1, far, -own)
    assert compare(ort, other).max_abs_diff > compare(ort, other).tolerance
    resolved, report = explain_by_ties(path, x, ort, other)
    assert report.failing == 1 and report.explained == 0
    assert compare(resolved, other).max_abs_diff > compare(resolved, other).tolerance


def test_a_flipped_kernel_bit_is_not_explained(setup, tmp_path):
    _, path, x, ort, _ = setup
    model = onnx.load(str(path))
    name = find_binary_layers(model)[1].kernel_name  # the second ±1 conv
    kernel = next(i for i in model.graph.initializer if i.name == name)
    values = numpy_helper.to_array(kernel).copy()
    values.flat[0] *= -1
    kernel.CopyFrom(numpy_helper.from_array(values, kernel.name))
    onnx.save(model, str(tmp_path / "corrupt.onnx"))
    other = run_onnx(tmp_path / "corrupt.onnx", x)
    resolved, report = explain_by_ties(path, x, ort, other)
    assert report.failing >= 1 and report.explained == 0
    assert compare(resolved, other).max_abs_diff > compare(resolved, other).tolerance


def test_a_broken_model_costs_one_sample_search(setup):
    _, path, x, ort, _ = setup
    _, report = explain_by_ties(path, x, ort, ort + 1.0)
    assert report.failing == len(x) and report.explained == 0
    assert report.runs <= 2 * (1 + MAX_STEPS * (MAX_CANDIDATES + 1))  # two searches, one sample


def test_matching_outputs_need_no_search(setup):
    _, path, x, ort, _ = setup
    resolved, report = explain_by_ties(path, x, ort, ort.copy())
    assert report.failing == 0 and report.runs == 0
    np.testing.assert_array_equal(resolved, ort)


def _torch_witness(net, probe_sources, layer=None, index=None, sign=None, logits_shift=0.0):
    """A `Witness` factory in torch: the net's logits and what each binarization reads (after an
    optional forced decision), keyed by the ONNX sources in graph order."""

    def witness(sample):
        captured = []
        hooks = [s.register_forward_pre_hook(lambda m, a: captured.append(a[0])) for s in net.signs]
        if layer is not None:
            net.signs[layer].force = (index, sign)
        try:
            with torch.no_grad():
                logits = net(torch.from_numpy(sample[None])).numpy()[0]
        finally:
            net.signs[layer if layer is not None else 0].force = None
            for hook in hooks:
                hook.remove()
        read = [c[0].numpy().copy() for c in captured]
        if layer is not None:  # what the forced decision binarized
            read[layer].reshape(-1)[index] = sign
        return logits + logits_shift, dict(zip(probe_sources, read, strict=True))

    return lambda: witness


def _witnessed_flip(setup, index=None, logits_shift=0.0):
    """(other runtime's outputs, its witness) with binarization 1's decision at `index` (the
    tie by default) taken against ONNX Runtime's own, on sample 0."""
    net, path, x, _, tie = setup
    index = tie if index is None else index
    probe = TieProbe(path)
    _, sources = probe.run(x[0], {})
    own = 1.0 if sources[1].reshape(-1)[index] >= 0 else -1.0
    other = _with_forced(net, x, 1, index, -own)
    return other, _torch_witness(net, probe.sources, 1, index, -own, logits_shift)


def test_a_witness_replays_the_tie_in_one_run(setup):
    _, path, x, ort, _ = setup
    other, witness = _witnessed_flip(setup)
    resolved, report = explain_by_ties(path, x, ort, other, witness=witness)
    assert report.explained == 1 and report.rows == [0] and report.positions == 1
    assert report.runs == 2  # ONNX Runtime's own output (no search step), then one replay
    after = compare(resolved, other)
    assert after.argmax_agreement == 1.0 and after.max_abs_diff <= after.tolerance


def test_a_witness_flipping_a_far_activation_is_not_explained(setup):
    _, path, x, ort, _ = setup
    _, sources = TieProbe(path).run(x[0], {})
    other, witness = _witnessed_flip(setup, index=int(np.abs(sources[1]).argmax()))
    _, report = explain_by_ties(path, x, ort, other, witness=witness)
    assert report.failing == 1 and report.explained == 0 and report.runs == 2  # no search


def test_a_witness_that_computed_something_else_is_not_trusted(setup):
    """Its logits differ from the other runtime's: the search decides, as without a witness."""
    _, path, x, ort, _ = setup
    other, witness = _witnessed_flip(setup, logits_shift=1.0)
    _, report = explain_by_ties(path, x, ort, other, witness=witness)
    assert report.explained == 1 and report.runs > 2


@pytest.mark.slow
def test_the_lce_witness_reads_what_onnx_runtime_binarizes(setup):
    """Each witness output is the same binarization input as the probe's, in ONNX's layout."""
    from converters.graph import load_onnx
    from converters.lce import LceWitness

    _, path, x, _, _ = setup
    probe = TieProbe(path)
    _, sources = probe.run(x[1], {})
    logits, witnessed = LceWitness(load_onnx(path))(x[1])
    assert sorted(witnessed) == sorted(probe.sources)
    for source, values in zip(probe.sources, sources, strict=True):
        assert witnessed[source].shape == values.shape
        np.testing.assert_allclose(witnessed[source], values, atol=1e-5 * np.abs(values).max())
    np.testing.assert_allclose(logits, run_onnx(path, x[1:2])[0], atol=1e-3)
