"""No false refusal on a correct conversion of a model of your own: four hand-written BNNs
(tests/support/own_models.py: the detach trick and Bi-Real's approx-sign; ±1 parameters, an
autograd STE, XNOR-Net++'s Γ and a matmul head; ReActNet's RSign and RPReLU with XNOR's α and a
torch.sign head; a DWNet of float depthwise and binary pointwise convs with a binary linear
head), each trained on mnist5k and on an image folder of flat backgrounds (ties common), each
converted through `pipeline`, through `train` + `export` + `convert`, and through
`convert_module`, every binary layer an `LceBconv2d`. One real tie is planted in each trained
model (tests/support/ties.py), so every `convert` of them replays at least one; a one-line
translator bug is still refused.

`make test` runs the mnist5k train+convert and convert_module cells of the ReActNet-style and
the DWNet models (latent_detach_bnn's planted tie is tests/stages/test_own_model_ties.py's, the
±1 model goes through pipeline in tests/stages/test_own_model_chain.py) and the flat-background
pipelines; the long tier runs the rest. Each cell prints how many
samples each comparison replayed (`pytest -s`).
"""

from __future__ import annotations

import pytest
from support import own_models
from support.cli import run_in_process
from support.guarantees import assert_one_line_error
from support.own_matrix import convert_cell, module_cell, pipeline_cell, train_run
from support.ties import TieSite, plant_in_run

pytestmark = pytest.mark.slow

MODELS = ["latent_detach_bnn", "plus_minus_one_bnn", "reactnet_bnn", "dw_bnn"]
SAMPLES = 100


def assert_converted(cell, model: str, what: str):
    print(f"\n{what} {model}: {cell}")
    assert cell.converted, cell.refusal
    assert cell.lce_bconv2d == cell.binary_layers == len(own_models.KERNELS[model])
    return cell


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """model -> a run trained on mnist5k and exported once (its samples are the planting's)."""
    runs = {}

    def run_of(model: str):
        if model not in runs:
            root = tmp_path_factory.mktemp(model)
            run = root / "run"
            train_run(model, "mnist5k", root, run)
            assert run_in_process("export", run, "--samples", SAMPLES).returncode == 0
            runs[model] = run
        return runs[model]

    return run_of


# make test trains two of the four here: latent_detach_bnn's planted tie is tests/stages/
# test_own_model_ties.py's, and plus_minus_one_bnn goes all the way through pipeline in
# tests/stages/test_own_model_chain.py; their cells here are long (about 2 minutes saved)
IN_MAKE_TEST = ("reactnet_bnn", "dw_bnn")
CELLS = [m if m in IN_MAKE_TEST else pytest.param(m, marks=pytest.mark.long) for m in MODELS]


@pytest.mark.parametrize("model", CELLS)
def test_train_then_convert_replays_a_planted_tie(trained, model):
    run = trained(model)
    tie = plant_in_run(run, TieSite(*own_models.TIE_SITES[model]))
    cell = assert_converted(convert_cell(run, SAMPLES), model, f"train+convert mnist5k {tie}")
    assert cell.replayed["PyTorch vs ONNX Runtime (export)"] >= 1
    assert cell.replayed["LCE vs ONNX Runtime"] + cell.replayed["LCE vs PyTorch"] >= 1


@pytest.mark.parametrize("model", CELLS)
def test_convert_module_converts_the_trained_module(trained, model, tmp_path):
    assert_converted(
        module_cell(trained(model), SAMPLES, tmp_path / "m.tflite"), model, "convert_module"
    )


@pytest.mark.parametrize("model", MODELS)
def test_pipeline_on_flat_backgrounds(model, tmp_path):
    assert_converted(
        pipeline_cell(model, "flat", tmp_path, tmp_path / "run", SAMPLES), model, "pipeline flat"
    )


@pytest.mark.long
@pytest.mark.parametrize("model", MODELS)
def test_pipeline_on_mnist5k(model, tmp_path):
    cell = pipeline_cell(model, "mnist5k", tmp_path, tmp_path / "run", 1000)
    assert_converted(cell, model, "pipeline mnist5k")


@pytest.mark.long
@pytest.mark.parametrize("model", MODELS)
def test_train_then_convert_and_convert_module_on_flat_backgrounds(model, tmp_path):
    run = tmp_path / "run"
    train_run(model, "flat", tmp_path, run)
    assert_converted(convert_cell(run, SAMPLES), model, "train+convert flat")
    assert_converted(module_cell(run, SAMPLES, tmp_path / "m.tflite"), model, "convert_module flat")


def test_a_translator_bug_in_a_model_of_your_own_is_still_refused(trained, monkeypatch):
    """Every binary kernel rotated by 180 degrees (tests/converters/gate/test_mutants.py's
    mutant) in the translation of a trained own model: refused, no flatbuffer written."""
    import bnnexport.converters.translate.tf_layers as tf_layers
    import numpy as np

    real = tf_layers.sign_kernel
    monkeypatch.setattr(
        tf_layers, "sign_kernel", lambda signs: real(np.ascontiguousarray(signs[::-1, ::-1]))
    )
    run = trained("reactnet_bnn")  # 3x3 binary kernels: a rotation changes them
    (run / "model-arm64.tflite").unlink(missing_ok=True)
    result = run_in_process("convert", run, "--target", "arm64")
    # which check speaks first (LCE vs ONNX Runtime, vs PyTorch, or the twins) depends on the
    # trained weights, which differ between CPUs (AVX2 vs AVX-512 sums): each is a refusal
    assert_one_line_error(result, 1, "LCE", " disagree ", "no flatbuffer kept")
    assert not (run / "model-arm64.tflite").exists()
