"""converters.gate: a rounding tie explains a difference; an exact zero, a non-tie, too many ties
or a changed prediction never does.

The candidate runtimes here are controlled: ONNX Runtime with chosen signs (`OnnxProbe`),
evaluated binarization by binarization to a fixed point, so a test decides exactly how the
"other runtime" binarizes. No TensorFlow is involved: these run in seconds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn as nn
from support.converter_nets import binary_conv, binary_linear, export, sign, trained_bn

from converters.errors import ConversionMismatchError
from converters.gate import GateOptions, OnnxProbe, Witness, signbit_negative, validate
from converters.validate import run_onnx

SHAPE = (1, 3, 12, 12)
Rule = Callable[[int, np.ndarray], np.ndarray]  # (binarization, its input) -> signs ±1


class Net(nn.Module):
    """float conv -> BN -> [sign -> ±1 conv -> BN] x2 with a real-valued shortcut -> ±1 dense."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 16, 3, padding=1)
        self.bn0 = trained_bn(nn.BatchNorm2d(16), seed=1)
        self.conv1 = binary_conv(16, 16, 3, padding=1)
        self.bn1 = trained_bn(nn.BatchNorm2d(16), seed=2)
        self.conv2 = binary_conv(16, 16, 3, padding=1)
        self.bn2 = trained_bn(nn.BatchNorm2d(16), seed=3)
        self.head = binary_linear(16 * 12 * 12, 10)

    def forward(self, x):
        x = self.bn0(self.first(x))
        x = x + self.bn1(self.conv1(sign(x)))  # Bi-Real style shortcut
        x = x + self.bn2(self.conv2(sign(x)))
        return self.head(sign(torch.flatten(x, 1)))


class ZeroNet(nn.Module):
    """sign -> ±1 1x1 conv (even fan-in) -> fresh BatchNorm with negative scales -> sign -> ±1
    conv: many binarization inputs are exactly zero (and -0.0 where a runtime folds the scale)."""

    def __init__(self):
        super().__init__()
        self.a = binary_conv(16, 16, 1)
        self.bn = nn.BatchNorm2d(16)
        with torch.no_grad():
            self.bn.weight[::2] = -1.0
        self.b = binary_conv(16, 8, 1)

    def forward(self, x):
        return self.b(sign(self.bn(self.a(sign(x))))).flatten(1)


def controlled(probe: OnnxProbe, rule: Rule, reported: Rule | None = None):
    """A runtime that binarizes by `rule`: (outputs of a batch, its witness). `reported` gives
    the binarization inputs its witness shows (default: the values it computed)."""

    def one(x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        logits, values = probe.run(x)
        for _ in range(len(probe.sources) + 1):  # binarization k depends only on those before
            logits, values = probe.run(x, [rule(k, v) for k, v in enumerate(values)])
        shown = [reported(k, v) if reported else v for k, v in enumerate(values)]
        return logits, shown

    def witness(x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        logits, shown = one(x)
        return logits, dict(zip(probe.sources, shown, strict=True))

    def outputs(batch: np.ndarray) -> np.ndarray:
        return np.stack([one(x)[0] for x in batch])

    return outputs, witness


def torch_sign(k: int, v: np.ndarray) -> np.ndarray:
    return np.where(v < 0, -1.0, 1.0).astype(np.float32)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """(onnx path, inputs, ORT outputs, tie index) with a non-zero rounding-size value at
    binarization 1 of sample 0: 2e-6 of that tensor's largest value."""
    torch.manual_seed(0)
    net = Net().eval()
    x = np.random.default_rng(0).standard_normal((6, *SHAPE[1:])).astype(np.float32)
    path = export(net, SHAPE, tmp_path_factory.mktemp("gate") / "net.onnx")
    _, values = OnnxProbe(path).run(x[0])
    channel, row, col = 5, 6, 7
    target = values[1][channel, row, col]
    with torch.no_grad():
        net.bn1.bias[channel] -= float(target) - 2e-6 * float(np.abs(values[1]).max())
    path = export(net, SHAPE, path)
    tie = int(np.ravel_multi_index((channel, row, col), (16, 12, 12)))
    return path, x, run_onnx(path, x), tie


def flip_at(index: int, binarization: int = 1, sample_only: bool = True) -> Rule:
    def rule(k: int, v: np.ndarray) -> np.ndarray:
        signs = torch_sign(k, v)
        if k == binarization:
            signs.reshape(-1)[index] *= -1
        return signs

    return rule


def mirrored_at(index: int, binarization: int = 1) -> Rule:
    """The witness shows the flipped value on the other side of zero (rounding did that)."""

    def shown(k: int, v: np.ndarray) -> np.ndarray:
        v = v.copy()
        if k == binarization:
            v.reshape(-1)[index] *= -1
        return v

    return shown


def test_a_rounding_tie_decided_the_other_way_is_explained(tied):
    path, x, ort, tie = tied
    probe = OnnxProbe(path)
    outputs, witness = controlled(probe, flip_at(tie), mirrored_at(tie))
    other = outputs(x[:1])
    assert np.abs(other - ort[:1]).max() > 1e-2  # the flip shows in the logits
    report = validate(ort[:1], other, x[:1], GateOptions(min_plain_agreement=0.0),
                      ("ORT", "other"), lambda: probe, Witness(witness))  # fmt: skip
    assert report.tie_samples == [0] and report.tie_positions == 1
    assert 0 < report.tie_largest <= 1e-5
    assert report.plain_max_abs_diff > report.tolerance >= report.max_abs_diff  # both reported


def test_a_flipped_sign_far_from_zero_is_a_mismatch(tied):
    path, x, ort, tie = tied
    probe = OnnxProbe(path)
    _, values = probe.run(x[0])
    far = int(np.abs(values[1]).reshape(-1).argmax())
    outputs, witness = controlled(probe, flip_at(far), mirrored_at(far))
    with pytest.raises(ConversionMismatchError, match="not a tie"):
        validate(ort[:1], outputs(x[:1]), x[:1], GateOptions(min_plain_agreement=0.0),
                 ("ORT", "other"), lambda: probe, Witness(witness))  # fmt: skip


def test_more_ties_than_the_bound_are_a_mismatch(tied):
    """With every value counted as a tie (tie_rtol 1), the bound on their number still holds."""
    path, x, ort, _ = tied
    probe = OnnxProbe(path)
    many = np.isin(np.arange(16 * 12 * 12), np.arange(0, 16 * 12 * 12, 7))  # 330: far > 0.1 %

    def rule(k: int, v: np.ndarray) -> np.ndarray:
        flips = np.where(many & (k == 1), -1.0, 1.0).reshape(v.shape) if v.size == many.size else 1
        return (torch_sign(k, v) * flips).astype(np.float32)

    def tiny(k: int, v: np.ndarray) -> np.ndarray:
        return np.where(rule(k, v) < 0, -1e-9, 1e-9).astype(np.float32)

    outputs, witness = controlled(probe, rule, tiny)
    options = GateOptions(tie_rtol=1.0, min_plain_agreement=0.0)
    with pytest.raises(ConversionMismatchError, match="rounding ties"):
        validate(ort[:1], outputs(x[:1]), x[:1], options, ("ORT", "other"), lambda: probe,
                 Witness(witness))  # fmt: skip


def test_an_exact_zero_binarized_by_its_sign_bit_is_always_a_mismatch(tmp_path):
    """The LCE convention the design notes warn about: -0.0 -> -1. Even with every bound opened
    (any number of ties, any distance, any plain agreement) it is refused."""
    torch.manual_seed(0)
    path = export(ZeroNet().eval(), (1, 16, 6, 6), tmp_path / "zero.onnx")
    x = np.random.default_rng(1).standard_normal((4, 16, 6, 6)).astype(np.float32)
    probe = OnnxProbe(path)
    _, values = probe.run(x[0])
    assert (values[1] == 0).mean() > 0.1  # many exact zeros reach the second binarization

    def as_negative_zero(k: int, v: np.ndarray) -> np.ndarray:
        return np.where(v == 0, -0.0, v).astype(np.float32)

    def rule(k: int, v: np.ndarray) -> np.ndarray:
        return np.where(signbit_negative(as_negative_zero(k, v)), -1.0, 1.0).astype(np.float32)

    outputs, witness = controlled(probe, rule, as_negative_zero)
    other = outputs(x)
    assert np.abs(other - run_onnx(path, x)).max() > 0  # the convention changes the outputs
    wide_open = GateOptions(tie_rtol=1.0, tie_fraction=1.0, min_plain_agreement=0.0)
    with pytest.raises(ConversionMismatchError, match="exact zero"):
        validate(run_onnx(path, x), other, x, wide_open, ("ORT", "sign-bit runtime"),
                 lambda: probe, Witness(witness, negative=signbit_negative))  # fmt: skip


def test_ties_may_not_change_predictions_the_reference_is_sure_of():
    """Two of six confident predictions changed: refused before any replay, however well ties
    would explain it. Predictions the reference is unsure of are left to the replay."""
    sure = np.eye(6, 10, dtype=np.float32) * 10.0  # margin 100 % of the range
    other = sure.copy()
    other[:2] = other[:2, ::-1]
    with pytest.raises(ConversionMismatchError, match="2 of the 6 predictions .* sure of"):
        validate(sure, other, np.zeros((6, 1)), GateOptions(), ("ORT", "other"))
    unsure = sure + np.eye(6, 10, k=1, dtype=np.float32) * 9.9  # margin 1 % of the range
    with pytest.raises(ConversionMismatchError, match="disagree on 6 samples"):  # no witness
        validate(unsure, other, np.zeros((6, 1)), GateOptions(), ("ORT", "other"))


def test_one_changed_prediction_is_left_to_the_replay():
    """On a small check set one genuine tie may flip one prediction (1 of 50 is 98 %)."""
    options = GateOptions()
    assert options.allowed_flips(50) == 1 and options.allowed_flips(1000) == 10


def test_the_report_counts_sure_predictions_and_how_many_changed():
    """The floor's plain numbers are reported: 6 sure predictions, 1 changed (allowed: one)."""
    sure = np.eye(6, 10, dtype=np.float32) * 10.0
    other = sure.copy()
    other[0] = other[0, ::-1]
    with pytest.raises(ConversionMismatchError, match="disagree on 1 samples"):  # no witness
        validate(sure, other, np.zeros((6, 1)), GateOptions(), ("ORT", "other"))
    report = validate(sure, sure + 1e-6, np.zeros((6, 1)))
    assert (report.sure_predictions, report.sure_changed) == (6, 0)
    unsure = sure + np.eye(6, 10, k=1, dtype=np.float32) * 9.9
    assert validate(unsure, unsure, np.zeros((6, 1))).sure_predictions == 0


def test_without_a_witness_every_sample_must_agree_plainly(tied):
    _, x, ort, _ = tied
    with pytest.raises(ConversionMismatchError, match="disagree on 6 samples"):
        validate(ort, ort + np.eye(6, 10, dtype=np.float32)[:, ::-1] * 0.5, x,
                 GateOptions(min_plain_agreement=0.0))  # fmt: skip


def test_zero_compared_samples_is_a_failure_not_agreement():
    empty = np.zeros((0, 10), np.float32)
    with pytest.raises(ConversionMismatchError, match="no samples"):
        validate(empty, empty, empty)


def test_agreeing_outputs_pass_with_plain_numbers_equal_to_resolved(tied):
    _, x, ort, _ = tied
    report = validate(ort, ort + 1e-6, x)
    assert report.tie_samples == [] and report.samples == 6
    assert report.plain_argmax_agreement == report.argmax_agreement == 1.0
    assert report.plain_max_abs_diff == report.max_abs_diff


def test_signs_that_do_not_reproduce_the_candidate_are_a_mismatch(tied):
    """A candidate whose logits are off for another reason than its signs (a wrong bias after
    the last binarization) is refused although each differing sign is a fine tie."""
    path, x, ort, tie = tied
    probe = OnnxProbe(path)
    outputs, witness = controlled(probe, flip_at(tie), mirrored_at(tie))
    off = np.zeros(10, np.float32)
    off[3] = 0.5
    shifted = Witness(lambda s: (witness(s)[0] + off, witness(s)[1]))
    with pytest.raises(ConversionMismatchError, match="still differs"):
        validate(ort[:1], outputs(x[:1]) + off, x[:1], GateOptions(min_plain_agreement=0.0),
                 ("ORT", "other"), lambda: probe, shifted)  # fmt: skip
