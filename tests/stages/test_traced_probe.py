"""bnnexport.stages.torch_probe.TracedProbe on client-style BNNs (tests/support/client_nets.py:
ReActNet, Bi-Real, XNOR-Net, IR-Net, an autograd STE, index-put, classic BinaryNet's hardtanh,
an index-new binary linear): every binarization of the normalised ONNX graph is matched in
order, and PyTorch given a set of signs computes what ONNX Runtime computes given the same
signs, which is what the gate's replay relies on."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from bnnexport.converters.gate import OnnxProbe
from bnnexport.converters.graph import load_onnx
from bnnexport.converters.normalize import normalize
from support import client_nets

from bnnexport.stages.export import onnx_export
from bnnexport.stages.torch_probe import TracedProbe, UntraceableModel

pytestmark = pytest.mark.slow  # an export per case: ~2 s each

NETS = ["reactnet", "bireal", "xnornet", "irnet", "autograd_ste", "index_put",
        "binarynet_classic", "index_new_linear"]  # fmt: skip
SHAPE = (1, 3, 16, 16)


def exported(net: torch.nn.Module, path, dynamo: bool = False):
    onnx_export(net, torch.zeros(SHAPE), path, dynamo=dynamo)
    onnx.save(onnx.load(str(path)), str(path))  # one file: dynamo writes its weights beside
    return path


def flipped_nearest_zero(values: list[np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime's own signs, each binarization's smallest |x| flipped: a tie decided the
    other way everywhere at once."""
    signs = []
    for v in values:
        s = np.where(v < 0, -1.0, 1.0).astype(np.float32)
        s.reshape(-1)[int(np.abs(v).argmin())] *= -1
        signs.append(s)
    return signs


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("name", NETS)
def test_pytorch_and_onnx_runtime_agree_under_the_same_imposed_signs(name, dynamo, tmp_path):
    if dynamo and name not in ("reactnet", "index_put"):
        pytest.skip("the dynamo export of two nets is enough here (each takes seconds)")
    net = getattr(client_nets, name)().eval()
    path = exported(net, tmp_path / "net.onnx", dynamo)
    x = np.random.default_rng(0).standard_normal((2, *SHAPE[1:])).astype(np.float32)
    probe = TracedProbe(net, path, x[0])
    ort = OnnxProbe(normalize(load_onnx(path))[0])
    assert probe.sources == ort.sources
    _, theirs = ort.run(x[1])
    signs = flipped_nearest_zero(theirs)
    mine_logits, mine = probe.run(x[1], signs)
    their_logits, theirs = ort.run(x[1], signs)
    assert np.abs(mine_logits - their_logits).max() <= 1e-4 * np.abs(their_logits).max()
    for a, b in zip(mine, theirs, strict=True):  # the values read are the ones before the sign
        assert np.abs(a.reshape(-1) - b.reshape(-1)).max() <= 1e-4 * np.abs(b).max()


def test_another_models_graph_is_untraceable_with_the_reason(tmp_path):
    path = exported(client_nets.index_new_linear().eval(), tmp_path / "other.onnx")
    x = np.zeros(SHAPE[1:], np.float32) + 0.5
    with pytest.raises(UntraceableModel, match=r"binarization 1 of 2 .* matches none"):
        TracedProbe(client_nets.reactnet().eval(), path, x)
