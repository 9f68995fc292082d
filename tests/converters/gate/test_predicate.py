"""bnnexport.converters.gate: a rounding tie explains a difference; an exact zero, a non-tie, too
many ties or a changed prediction never does.

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
from bnnexport.converters.errors import ConversionMismatchError
from bnnexport.converters.gate import (
    GateOptions,
    OnnxProbe,
    Replay,
    Witness,
    signbit_negative,
    validate,
)
from bnnexport.converters.runtimes import run_onnx
from support.converter_nets import (
    binary_conv,
    binary_linear,
    export,
    sign,
    torch_sign,
    trained_bn,
)

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
        signs = torch_sign(v)
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
    report = validate(ort[:1], other, x[:1], GateOptions(),
                      ("ORT", "other"), Replay(lambda: probe, Witness(witness)))  # fmt: skip
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
        validate(ort[:1], outputs(x[:1]), x[:1], GateOptions(),
                 ("ORT", "other"), Replay(lambda: probe, Witness(witness)))  # fmt: skip


def test_more_ties_than_the_bound_are_a_mismatch(tied):
    """With every value counted as a tie (tie_rtol 1), the bound on their number still holds."""
    path, x, ort, _ = tied
    probe = OnnxProbe(path)
    many = np.isin(np.arange(16 * 12 * 12), np.arange(0, 16 * 12 * 12, 7))  # 330: far > 0.1 %

    def rule(k: int, v: np.ndarray) -> np.ndarray:
        flips = np.where(many & (k == 1), -1.0, 1.0).reshape(v.shape) if v.size == many.size else 1
        return (torch_sign(v) * flips).astype(np.float32)

    def tiny(k: int, v: np.ndarray) -> np.ndarray:
        return np.where(rule(k, v) < 0, -1e-9, 1e-9).astype(np.float32)

    outputs, witness = controlled(probe, rule, tiny)
    options = GateOptions(tie_rtol=1.0)
    with pytest.raises(ConversionMismatchError, match="rounding ties"):
        validate(ort[:1], outputs(x[:1]), x[:1], options, ("ORT", "other"),
                 Replay(lambda: probe, Witness(witness)))  # fmt: skip


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
    wide_open = GateOptions(tie_rtol=1.0, tie_fraction=1.0)
    with pytest.raises(ConversionMismatchError, match="exact zero"):
        validate(run_onnx(path, x), other, x, wide_open, ("ORT", "sign-bit runtime"),
                 Replay(lambda: probe, Witness(witness, negative=signbit_negative)))  # fmt: skip


def test_changed_predictions_the_reference_is_sure_of_are_left_to_the_replay():
    """No rule on plain agreement: a deep network's single tie may legitimately change a
    prediction with a 5 % margin. Without a witness every sample must agree plainly."""
    sure = np.eye(6, 10, dtype=np.float32) * 10.0  # margin 100 % of the range
    other = sure.copy()
    other[:2] = other[:2, ::-1]
    with pytest.raises(ConversionMismatchError, match="disagree on 2 samples"):  # no witness
        validate(sure, other, np.zeros((6, 1)), GateOptions(), ("ORT", "other"))


def test_the_report_counts_sure_predictions_and_how_many_changed():
    """How many predictions the reference is sure of, and how many changed, are reported."""
    sure = np.eye(6, 10, dtype=np.float32) * 10.0
    report = validate(sure, sure + 1e-6, np.zeros((6, 1)))
    assert (report.sure_predictions, report.sure_changed) == (6, 0)
    unsure = sure + np.eye(6, 10, k=1, dtype=np.float32) * 9.9
    assert validate(unsure, unsure, np.zeros((6, 1))).sure_predictions == 0


def test_without_a_witness_every_sample_must_agree_plainly(tied):
    _, x, ort, _ = tied
    with pytest.raises(ConversionMismatchError, match="disagree on 6 samples"):
        validate(ort, ort + np.eye(6, 10, dtype=np.float32)[:, ::-1] * 0.5, x,
                 GateOptions())  # fmt: skip


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
        validate(ort[:1], outputs(x[:1]) + off, x[:1], GateOptions(),
                 ("ORT", "other"), Replay(lambda: probe, shifted))  # fmt: skip


def _twice(x: np.ndarray) -> np.ndarray:
    """x[0], and x[0] changed at one pixel far from the tie: binarization 1 keeps the tie's value
    bit for bit (outside that pixel's receptive field) while the logits change."""
    other = x[0].copy()
    other[0, 0, 0] += 1.0
    return np.stack([x[0], other])


def test_the_same_value_decided_differently_twice_is_not_a_tie(tied):
    """A tie is an accident of one sample's sums; a fixed value (here the same pre-sign value
    on two inputs) that the candidate decides the other way wherever it occurs is a rule."""
    path, _, _, tie = tied
    probe = OnnxProbe(path)
    x = _twice(tied[1])
    _, first = probe.run(x[0])
    _, second = probe.run(x[1])
    assert first[1].reshape(-1)[tie] == second[1].reshape(-1)[tie]  # the same value twice
    outputs, witness = controlled(probe, flip_at(tie), mirrored_at(tie))
    ort, other = run_onnx(path, x), outputs(x)
    assert np.abs(ort[0] - ort[1]).max() > 0  # two different samples
    replay = Replay(lambda: probe, Witness(witness))
    each = [validate(ort[k : k + 1], other[k : k + 1], x[k : k + 1], GateOptions(), ("ORT", "o"),
                     replay) for k in range(2)]  # fmt: skip
    assert [r.tie_positions for r in each] == [1, 1]  # alone, each is a fine tie
    with pytest.raises(ConversionMismatchError, match=r"binarized differently on samples \[0, 1\]"):
        validate(ort, other, x, GateOptions(), ("ORT", "other"), replay)
    # an arbiter that decides the value as the reference does: still the candidate's own rule
    agreeing = Replay(lambda: probe, Witness(witness), arbiters=[lambda: OnnxProbe(path)])
    with pytest.raises(ConversionMismatchError, match="no other reference decides it"):
        validate(ort, other, x, GateOptions(), ("ORT", "other"), agreeing)


class Splitting:
    """A second reference runtime that computes binarization 1 at `index` on the other side of
    zero: the references themselves split on that value."""

    def __init__(self, probe: OnnxProbe, index: int):
        self.probe, self.index, self.sources = probe, index, probe.sources

    def run(self, x: np.ndarray, imposed: list[np.ndarray] | None = None):
        logits, values = self.probe.run(x, imposed)
        return logits, [mirrored_at(self.index)(k, v) for k, v in enumerate(values)]


def test_a_recurring_value_the_references_split_on_is_a_tie(tied):
    """QuickNet's float stem at 224x224: PyTorch and ONNX Runtime round one fixed value to
    either side of zero on every sample. With an arbiter that splits from the reference, the
    candidate siding with it is no rule of its own; at export (`judged` empty, the candidate is
    a reference runtime) nothing is judged."""
    path, _, _, tie = tied
    probe = OnnxProbe(path)
    x = _twice(tied[1])
    outputs, witness = controlled(probe, flip_at(tie), mirrored_at(tie))
    ort, other = run_onnx(path, x), outputs(x)
    split = Replay(lambda: probe, Witness(witness), arbiters=[lambda: Splitting(probe, tie)])
    report = validate(ort, other, x, GateOptions(), ("ORT", "other"), split)
    assert report.tie_samples == [0, 1] and report.argmax_agreement == 1.0
    export_like = Replay(lambda: probe, Witness(witness), judged=frozenset())
    assert validate(ort, other, x, GateOptions(), ("ORT", "o"), export_like).tie_samples == [0, 1]


def test_a_recurring_value_is_judged_only_where_the_candidate_decides_signs_exactly(tied):
    """`judged` names the binarization inputs the candidate decides by a rule of its own (the
    translator's tie-broken accumulators); a recurring split elsewhere is float rounding."""
    path, _, _, tie = tied
    probe = OnnxProbe(path)
    x = _twice(tied[1])
    outputs, witness = controlled(probe, flip_at(tie), mirrored_at(tie))
    ort, other = run_onnx(path, x), outputs(x)
    elsewhere = Replay(lambda: probe, Witness(witness), judged=frozenset(probe.sources[:1]))
    assert validate(ort, other, x, GateOptions(), ("ORT", "o"), elsewhere).tie_samples == [0, 1]
    there = Replay(lambda: probe, Witness(witness), judged=frozenset(probe.sources[1:2]))
    with pytest.raises(ConversionMismatchError, match="binarized differently on samples"):
        validate(ort, other, x, GateOptions(), ("ORT", "other"), there)


def test_one_tie_on_a_repeated_input_is_counted_once(tied):
    path, x, _, tie = tied
    probe = OnnxProbe(path)
    outputs, witness = controlled(probe, flip_at(tie), mirrored_at(tie))
    same = np.stack([x[0], x[0]])
    report = validate(run_onnx(path, same), outputs(same), same, GateOptions(), ("ORT", "o"),
                      Replay(lambda: probe, Witness(witness)))  # fmt: skip
    assert report.tie_samples == [0, 1]


def test_a_refusal_carries_diagnostics_naming_the_first_differing_binarization(tied):
    path, x, ort, _ = tied
    probe = OnnxProbe(path)
    _, values = probe.run(x[0])
    far = int(np.abs(values[1]).reshape(-1).argmax())
    outputs, witness = controlled(probe, flip_at(far), mirrored_at(far))
    with pytest.raises(ConversionMismatchError) as refused:
        validate(ort[:1], outputs(x[:1]), x[:1], GateOptions(), ("ORT", "other"),
                 Replay(lambda: probe, Witness(witness)))  # fmt: skip
    details = refused.value.diagnostics
    assert details["refused_sample"] == 0 and details["failing_samples"] == [0]
    assert details["first_differing_binarization"] == probe.sources[1]
    assert details["binarizations"][0]["positions"] >= 1
    assert details["binarizations"][0]["largest"] == pytest.approx(1.0)
    assert "not a tie" in details["why"]


def test_a_model_with_exact_zeros_by_the_thousand_is_inconclusive_not_wrong(tmp_path):
    """ZeroNet's second binarization sees exact zeros at many positions: more than ties could
    explain, so a refusal on it is explained as a degenerate model, naming where and why."""
    from bnnexport.converters.gate import inconclusive

    torch.manual_seed(0)
    path = export(ZeroNet().eval(), (1, 16, 6, 6), tmp_path / "zero.onnx")
    x = np.random.default_rng(1).standard_normal((4, 16, 6, 6)).astype(np.float32)
    probe = OnnxProbe(path)
    error = ConversionMismatchError("LCE vs ORT disagree", {"comparison": "LCE vs ORT"})
    found = inconclusive(error, probe, x, [2, 3], GateOptions(), twin="passed")
    assert found is not None and found.exit_code == 1
    value = probe.run(x[2])[1][1]
    near = int((np.abs(value) <= 1e-5 * np.abs(value).max()).sum())
    assert near > GateOptions().tie_bound(value.size)
    assert f"{near} of 576 inputs of binarization {probe.sources[1]!r}" in str(found)
    assert f"({int((value == 0).sum())} exactly 0;" in str(found)
    assert "on sample 2" in str(found) and "BatchNorm with its default statistics" in str(found)
    assert "--trust-twin" in str(found) and found.diagnostics["twin"] == "passed"
    assert inconclusive(error, probe, x, [2], GateOptions(tie_fraction=1.0)) is None


def test_a_sign_far_from_zero_is_wrong_even_in_a_degenerate_model(tmp_path):
    """Near-zero values by the thousand excuse only what rounding can do: a refusal whose
    differing signs lie far from zero keeps its own message."""
    from bnnexport.converters.gate import inconclusive

    torch.manual_seed(0)
    path = export(ZeroNet().eval(), (1, 16, 6, 6), tmp_path / "zero.onnx")
    x = np.random.default_rng(1).standard_normal((4, 16, 6, 6)).astype(np.float32)
    far = {"source": "s", "positions": 1, "size": 576, "largest": 0.5, "exact_zeros": 0,
           "reference_largest": 0.5}  # fmt: skip
    error = ConversionMismatchError("wrong", {"binarizations": [far], "why": "not a tie"})
    assert inconclusive(error, OnnxProbe(path), x, [2], GateOptions()) is None
    near = {**far, "reference_largest": 1e-7, "positions": 300}  # the candidate's: far
    error = ConversionMismatchError("ties", {"binarizations": [near], "why": "300 signs differ"})
    assert inconclusive(error, OnnxProbe(path), x, [2], GateOptions()) is not None


def test_a_value_computed_otherwise_is_refused_even_when_every_sign_is_explained(tied):
    """A replay explains signs, never values: with the candidate's signs imposed, the reference
    computes the same float function, so each binarization input must agree within rtol of its
    largest value. (LCE's fused output transform of a one-padded binary conv once lost the
    BatchNorm bias of a channel with a huge multiplier: every sign explained, values 7e-4 of
    the range off.) Where the candidate's values are its own (`judged`: tie-broken
    accumulators) only signs are compared."""
    path, x, ort, tie = tied
    probe = OnnxProbe(path)
    _, values = probe.run(x[0])
    far = int(np.abs(values[1]).reshape(-1).argmax())

    def shown(k: int, v: np.ndarray) -> np.ndarray:
        v = mirrored_at(tie)(k, v)
        if k == 1:
            v.reshape(-1)[far] *= 1.01  # same sign, 1 % off
        return v

    outputs, witness = controlled(probe, flip_at(tie), shown)
    candidate = outputs(x[:1])
    checked = Replay(lambda: probe, Witness(witness), judged=frozenset())
    with pytest.raises(ConversionMismatchError, match="a value computed otherwise") as refused:
        validate(ort[:1], candidate, x[:1], GateOptions(), ("ORT", "other"), checked)
    assert f"input {far} " in str(refused.value)
    own = Replay(lambda: probe, Witness(witness), judged=frozenset(probe.sources))
    assert validate(ort[:1], candidate, x[:1], GateOptions(), ("ORT", "o"), own).tie_samples == [0]
