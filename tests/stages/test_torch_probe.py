"""bnnexport.stages.torch_probe: PyTorch's binarizations, read and imposed through hooks, line up
with the exported ONNX graph's (what lets the gates replay signs in PyTorch)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from bnnexport.converters.gate import OnnxProbe
from support.fresh_run import fresh_run

from bnnexport.errors import FidelityError
from bnnexport.run.checkpoint import load_model
from bnnexport.stages.export import export_onnx
from bnnexport.stages.torch_probe import TorchProbe


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    run = fresh_run(tmp_path_factory.mktemp("probe") / "run")
    export_onnx(run, samples=8)
    x = np.load(run / "samples.npz")["inputs"].astype(np.float32)
    return load_model(run), run / "model.onnx", x


def test_binarization_inputs_match_onnx_runtime_source_by_source(exported):
    model, path, x = exported
    torch_probe, onnx_probe = TorchProbe(model, path), OnnxProbe(path)
    assert torch_probe.sources == onnx_probe.sources and len(torch_probe.sources) == 3
    logits, values = torch_probe.run(x[0])
    onnx_logits, onnx_values = onnx_probe.run(x[0])
    np.testing.assert_allclose(logits, onnx_logits, atol=1e-3)
    for ours, theirs in zip(values, onnx_values, strict=True):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, atol=1e-3)


def test_imposed_signs_replace_pytorchs_own(exported):
    """All -1 at every binarization: PyTorch and ONNX Runtime then compute the same logits,
    which differ from the model's own."""
    model, path, x = exported
    torch_probe, onnx_probe = TorchProbe(model, path), OnnxProbe(path)
    _, values = onnx_probe.run(x[0])
    minus = [-np.ones_like(v) for v in values]
    forced, _ = torch_probe.run(x[0], minus)
    np.testing.assert_allclose(forced, onnx_probe.run(x[0], minus)[0], atol=1e-3)
    assert np.abs(forced - torch_probe.run(x[0])[0]).max() > 1e-2


def test_a_model_with_other_binarizations_than_the_onnx_graph_is_refused(exported):
    model, path, x = exported
    probe = TorchProbe(model, path)
    probe.calls = probe.calls[:-1]  # as if the ONNX graph had one binarization fewer
    with pytest.raises(FidelityError, match="cannot be matched up"):
        probe.run(x[0])


def test_k_bit_activations_are_no_binarization_to_match(tmp_path):
    """DoReFa's 2-bit quantizer exports no sign pattern: PyTorch's probe leaves it out, so the
    binary layer after it still lines up with the ONNX graph's one binarization."""
    import torch
    from torch import nn

    from bnnexport.nn.layers import BinaryConv2d

    model = nn.Sequential(
        BinaryConv2d(3, 8, 3, input_quantizer="dorefa"), nn.BatchNorm2d(8), BinaryConv2d(8, 8, 3)
    ).eval()
    model[1].running_mean.fill_(0.05)  # sums of thirds are never within rounding of 0.05
    path = tmp_path / "mixed.onnx"
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    torch.onnx.export(model, torch.from_numpy(x), str(path), dynamo=False)
    probe = TorchProbe(model, path)
    assert len(probe.sources) == 1
    logits, values = probe.run(x[0])  # one binarization seen, as in the ONNX graph
    assert len(values) == 1
    np.testing.assert_allclose(logits, OnnxProbe(path).run(x[0])[0], atol=1e-4)


def test_pytorchs_twin_takes_prelu_slopes_the_exporter_reshaped(tmp_path):
    """torch exports PReLU's slopes unsqueezed to [C, 1, 1], which the normaliser folds into an
    initializer named after the Unsqueeze: the twin finds their parameter by its twin value,
    and PyTorch's twin then computes what ONNX Runtime's twin does."""
    import torch
    from bnnexport.converters.gate.twin import exact_grid_twin, grid_inputs
    from bnnexport.converters.normalize import normalize
    from bnnexport.converters.runtimes import run_onnx
    from torch import nn

    from bnnexport.nn.layers import BinaryConv2d
    from bnnexport.stages.torch_probe import twin_model

    # a float conv after the PReLU, so every slope shows in the outputs (a sign would hide it)
    model = nn.Sequential(BinaryConv2d(3, 8, 3), nn.PReLU(8), nn.Conv2d(8, 4, 3)).eval()
    with torch.no_grad():
        model[1].weight.copy_(torch.linspace(-0.5, 0.9, 8))  # eight slopes, none on the grid
    path = tmp_path / "prelu.onnx"
    torch.onnx.export(model, torch.zeros(1, 3, 8, 8), str(path), dynamo=False)
    twin = exact_grid_twin(normalize(onnx.load(str(path)))[0])
    x = grid_inputs(np.random.default_rng(0).standard_normal((2, 3, 8, 8)))
    with torch.no_grad():
        ours = twin_model(model, twin)(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(ours, run_onnx(twin.SerializeToString(), x))
