"""The BNNs people actually write convert: bitorch, Brevitas (QONNX and plain ONNX), and the
ReActNet / Bi-Real / XNOR-Net / IR-Net / custom-autograd / index-put idioms, each exported with
both torch exporters where the client allows (Brevitas' legacy export fails inside torch 2.13),
normalised, translated and through the whole conversion gate (`tests/support/client_nets.py`).

Every binary layer must become an LceBconv2d, and LCE must agree with ONNX Runtime on the
original file plainly (tie-replayed samples are listed in the report and still bounded by the
gate); with the row's key normaliser pass disabled, the conversion ends in one line naming the
node and its op type. The bitorch ResNets and QuickNetSmall are marked slow (30-60 s each).
"""

from __future__ import annotations

import pytest
from support.cli import invoke
from support.client_nets import ROWS, Row, export_onnx, sample_inputs

pytestmark = pytest.mark.filterwarnings("ignore")


def _params(rows: list[Row], long: bool = False) -> list:
    """Rows as parameters; with `long`, the full-size bitorch ResNets and QuickNetSmall (20-30 s
    each) are in the long tier (`make test-all`)."""

    def marks(row: Row) -> list:
        return ([pytest.mark.slow] + ([pytest.mark.long] if long else [])) if row.slow else []

    return [pytest.param(r, id=r.id, marks=marks(r)) for r in rows]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Row -> (ONNX path, input shape), exported once per row."""
    cache: dict[str, tuple] = {}
    root = tmp_path_factory.mktemp("clients")

    def get(row: Row):
        if row.id not in cache:
            model, shape = row.build()
            cache[row.id] = (export_onnx(model, shape, root / f"{row.id}.onnx", row.exporter),
                             shape)  # fmt: skip
        return cache[row.id]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("row", _params(ROWS, long=True))
def test_every_binary_layer_becomes_an_lce_bconv2d_and_the_gate_passes(row, exported):
    from bnnexport.converters.lce import convert_onnx

    from bnnexport.stages.verify import verify_onnx

    path, shape = exported(row)
    result = convert_onnx(path, path.with_suffix(".tflite"), inputs=sample_inputs(shape))
    assert result.binary_layers > 0
    # verify on the same file agrees with what convert did: strict, the same binary layers
    verified = verify_onnx(path)
    assert verified.strict and len(verified.layers) == result.lce_bconv2d
    assert result.lce_bconv2d == result.binary_layers and result.float_fallbacks == []
    ort_gate = result.gate("ONNX Runtime")
    assert ort_gate.argmax_agreement == 1.0
    if not ort_gate.tie_samples:  # plain agreement wherever no tie is involved
        assert ort_gate.plain_argmax_agreement == 1.0
    assert all(t.plain_argmax_agreement == 1.0 for t in result.twin)
    assert result.normalized.applied.get(row.key_pass, 0) > 0
    print(f"{row.id}: {result.seconds:.1f} s, {result.lce_bconv2d} LceBconv2d")


@pytest.mark.parametrize("row", _params(ROWS))
def test_verify_finds_the_binary_layers_convert_finds(row, exported):
    """verify and convert read the same normalised graph: the layers `convert` makes binary
    (`find_binary_layers_in` after `normalize`) are exactly those `verify` calls strict."""
    from bnnexport.converters.graph import OnnxGraph, load_onnx
    from bnnexport.converters.normalize import normalize
    from bnnexport.converters.patterns import find_binary_layers_in

    from bnnexport.stages.verify import verify_onnx

    path, _ = exported(row)
    report = verify_onnx(path)
    model, _ = normalize(load_onnx(path))
    converted = [m.node_name for m in find_binary_layers_in(OnnxGraph.folded(model)) if m.binary]
    assert report.strict and [layer.name for layer in report.layers] == converted != []


@pytest.mark.parametrize("row", _params(ROWS))
def test_without_its_key_rewrite_the_refusal_is_one_line_naming_the_node(row, exported):
    path, _ = exported(row)
    result = invoke("convert", path, "--disable-rewrite", row.key_pass, "--json")
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bnnexport: error:"), result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if row.key_pass == "plain-sign":  # a ±1 layer behind a plain Sign: the check fails, exit 1
        assert result.exit_code == 1 and "plain Sign" in lines[0]
    else:
        assert result.exit_code == 2 and f"of op type {row.refused_op}" in lines[0]
        assert "unsupported ONNX node '" in lines[0]
    assert not path.with_name(f"{path.stem}-arm64.tflite").exists()


@pytest.fixture(scope="module")
def larq_like(tmp_path_factory):
    """A larq model as tf2onnx writes it: NHWC, dynamic batch, `serving/input_1:0`, a
    Transpose around every Conv, a dynamic-batch Flatten (`tests/support/tf2onnx_nets.py`)."""
    import onnx
    from support.tf2onnx_nets import larq_like as build

    model, shape = build()
    path = tmp_path_factory.mktemp("tf2onnx") / "larq_like.onnx"
    onnx.save(model, str(path))
    return path, shape


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_tf2onnx_larq_graph_converts_at_the_batch_given(larq_like, batch):
    from bnnexport.converters.batch import convert_batched

    path, shape = larq_like
    out = path.with_name(f"larq-b{batch}.tflite")
    result = convert_batched(path, out, batch, inputs=sample_inputs(shape))
    assert result.binary_layers == 3 and result.lce_bconv2d == 3  # two convs and the dense
    assert result.fully_connected == 0 and result.float_fallbacks == []
    assert result.gate("ONNX Runtime").plain_argmax_agreement == 1.0
    assert result.batch == batch
    assert {"transpose-binarized", "transpose-sink"} <= set(result.normalized.applied)


@pytest.mark.slow
def test_tf2onnx_without_moving_its_transposes_refuses_in_one_line(larq_like):
    path, _ = larq_like
    result = invoke("convert", path, "--disable-rewrite", "transpose-binarized")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1
    assert "model/bconv1_conv" in lines[0] and "would stay float" in lines[0]
