"""bnnexport.converters.normalize.slicing: `torch.split`, `chunk` and in-place channel updates, as
both torch exporters write them, become static Slices and Concats, exactly (ONNX Runtime gives the
same outputs before and after), and what is not one channel range stays as it was."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
from bnnexport.converters.normalize import normalize
from bnnexport.converters.runtimes import run_onnx

SHAPE = (1, 128, 4, 4)


def exported(fn, exporter: str) -> onnx.ModelProto:
    """`fn` as a module, exported by the legacy (opset 17, no constant folding, as bnnexport
    exports) or the dynamo exporter."""

    class Module(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    x = torch.randn(*SHAPE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            return torch.onnx.export(Module(), (x,), dynamo=True).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(Module(), x, buffer, dynamo=False, do_constant_folding=False)
        return onnx.load_from_string(buffer.getvalue())


def normalized_exactly(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """The normalised model and its passes, after checking it computes what `model` does."""
    after, report = normalize(model)
    x = np.random.default_rng(0).standard_normal((4, *SHAPE[1:])).astype(np.float32)
    x[:, ::3] = 0.0
    np.testing.assert_array_equal(
        run_onnx(model.SerializeToString(), x), run_onnx(after.SerializeToString(), x)
    )
    return after, report.applied


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node if n.op_type != "Constant"]


def in_place(x):
    x = x * 2.0
    x[:, -64:] += x[:, :64] * 3.0
    return torch.relu(x)


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_an_in_place_channel_update_becomes_one_concat_of_slices(exporter):
    after, applied = normalized_exactly(exported(in_place, exporter))
    assert applied["scatter-concat"] >= 1
    assert "ScatterND" not in ops(after) and "Transpose" not in ops(after)
    assert ops(after).count("Concat") == 1, ops(after)  # the legacy exporter scatters twice


@pytest.mark.parametrize(
    "fn, parts",
    [
        (lambda x: torch.split(x, [96, 32], dim=1), 2),
        (lambda x: x.chunk(3, dim=1), 3),  # 43 + 43 + 42: the last part smaller
    ],
    ids=["split-sizes", "chunk-uneven"],
)
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_split_and_chunk_become_one_slice_per_part(exporter, fn, parts):
    def summed(x):
        return sum(p.sum(1, keepdim=True) * (k + 1) for k, p in enumerate(fn(x)))

    after, _ = normalized_exactly(exported(summed, exporter))
    assert "Split" not in ops(after) and ops(after).count("Slice") == parts, ops(after)


def every_other_channel(x):
    x = x * 2.0
    x[:, ::2] += 1.0  # channels 0, 2, 4, ...: not one range
    return torch.relu(x)


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_a_scatter_that_is_not_one_channel_range_stays(exporter):
    after, applied = normalized_exactly(exported(every_other_channel, exporter))
    assert applied.get("scatter-concat", 0) == 0 and "ScatterND" in ops(after)
