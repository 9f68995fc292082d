"""bnnexport pack: 1 bit per binary weight in safetensors, exact round trip, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support.cli import run_in_process

import bnnexport
from bnnexport.datasets import load_dataset
from bnnexport.errors import CheckpointError
from bnnexport.run.checkpoint import load_checkpoint, load_model, load_packed, save_checkpoint
from bnnexport.stages.pack import pack

KERNELS = ("features.2.weight", "features.5.weight", "classifier.1.weight")


def mnist_inputs(count: int = 500) -> torch.Tensor:
    test = load_dataset("mnist5k", None, augment=False).test
    return torch.stack([test[k][0] for k in range(count)])


def metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as handle:
        return handle.metadata()


@pytest.mark.slow
def test_packed_model_outputs_equal_the_original_bit_for_bit(trained_run):
    pack(trained_run)
    inputs = mnist_inputs()
    with torch.no_grad():
        original = load_model(trained_run)(inputs)
        packed = bnnexport.load_packed(trained_run / "model.safetensors")(inputs)
    assert torch.equal(original, packed)
    assert original.view(torch.int32).equal(packed.view(torch.int32))  # bits, not just values


def test_packed_state_equals_the_checkpoint_state_exactly(trained_run):
    pack(trained_run)
    original = load_checkpoint(trained_run)["model"]
    restored = load_packed(trained_run / "model.safetensors").state_dict()
    assert original.keys() == restored.keys()
    for key, value in original.items():
        assert restored[key].dtype == value.dtype, key
        assert torch.equal(restored[key], value), key


def test_load_model_accepts_a_packed_file(trained_run):
    pack(trained_run)
    model = load_model(trained_run / "model.safetensors")
    assert not model.training
    assert torch.equal(model.features[2].weight, load_model(trained_run).features[2].weight)


def test_binary_kernels_take_one_32nd_of_their_float32_bytes(trained_run):
    report = pack(trained_run)
    tensors = load_file(trained_run / "model.safetensors")
    shapes = json.loads(metadata(trained_run / "model.safetensors")["binary"])
    assert sorted(shapes) == sorted(KERNELS)
    for key in KERNELS:
        count = int(np.prod(shapes[key]))
        assert tensors[key].dtype == torch.uint8
        assert tensors[key].numel() == -(-count // 8)  # ceil: 1 bit each, one padded byte at most
    assert report.binary_float32_bytes == 4 * report.binary_parameters
    assert report.binary_packed_bytes * 32 == report.binary_float32_bytes  # all multiples of 8
    # the whole file: packed kernels + real tensors + a small header with the metadata
    size = (trained_run / "model.safetensors").stat().st_size
    assert size == report.packed_bytes
    assert size < report.binary_float32_bytes / 32 + report.real_bytes + 8192
    assert report.file_ratio == pytest.approx(size / report.float32_bytes)
    assert report.binary_kernel_ratio == 1 / 32


def test_the_pipeline_line_names_which_ratio_it_prints(trained_run):
    from types import SimpleNamespace

    from bnnexport.stages.pipeline import PipelineReport

    stage = pack(trained_run).to_json()
    no_bench = SimpleNamespace(to_table=lambda: "")
    report = PipelineReport(str(trained_run), {"pack": stage}, {"pack": 0.1}, no_bench, None)
    line = report.to_table().splitlines()[1]
    assert f"file_ratio={stage['file_ratio']:.4g}, binary_kernel_ratio=0.03125)" in line
    assert " ratio=" not in line


def test_bit_is_one_iff_the_weight_is_minus_one(trained_run):
    pack(trained_run)
    weight = load_checkpoint(trained_run)["model"]["features.2.weight"].reshape(-1)[:16]
    packed = load_file(trained_run / "model.safetensors")["features.2.weight"][:2]
    # the first weight is the most significant bit of the first byte (numpy.packbits' order)
    expected = [sum(128 >> i for i in range(8) if weight[8 * b + i] == -1) for b in range(2)]
    assert packed.tolist() == expected


def test_metadata_describes_the_model(trained_run):
    pack(trained_run)
    meta = metadata(trained_run / "model.safetensors")
    assert meta["format"] == "bnnexport-packed" and meta["version"] == "1"
    assert meta["model_name"] == "mnist-bnn"
    assert json.loads(meta["model_kwargs"])["input_shape"] == [1, 28, 28]
    assert json.loads(meta["config"])["optimizer"] == "bop"
    assert json.loads(meta["shapes"])["classifier.1.weight"] == [128, 3136]
    assert len(meta["content_hash"]) == 64


def test_pack_cli_prints_json_and_writes_pack_json(trained_run):
    result = run_in_process("pack", str(trained_run), "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed == json.loads((trained_run / "pack.json").read_text())
    assert printed["packed_bytes"] < printed["float32_bytes"] / 20


def test_pack_refuses_a_model_that_does_not_verify(trained_run):
    data = load_checkpoint(trained_run)
    data["model"]["classifier.1.weight"][2, 3] = 0.5
    save_checkpoint(trained_run / "checkpoint.pt", {k: v for k, v in data.items() if k != "format"})
    result = run_in_process("pack", str(trained_run))
    assert result.returncode == 1
    assert "classifier.1" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (trained_run / "model.safetensors").exists()


def test_tampered_content_hash_is_refused(trained_run):
    pack(trained_run)
    path = trained_run / "model.safetensors"
    meta = metadata(path)
    meta["content_hash"] = "0" * 64
    save_file(load_file(path), path, metadata=meta)
    result = run_in_process("verify", str(path))
    assert result.returncode == 2
    assert "content hash" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_flipped_weight_bit_is_refused(trained_run):
    pack(trained_run)
    path = trained_run / "model.safetensors"
    tensors = load_file(path)
    tensors["features.5.weight"][10] ^= 1  # one binary weight changes sign
    save_file(tensors, path, metadata=metadata(path))
    with pytest.raises(CheckpointError, match="content hash"):
        load_packed(path)


def test_truncated_packed_file_exits_2_with_one_line(trained_run):
    pack(trained_run)
    path = trained_run / "model.safetensors"
    path.write_bytes(path.read_bytes()[:30000])
    result = run_in_process("verify", str(path))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_checkpoint_renamed_to_safetensors_is_refused(trained_run, tmp_path):
    foreign = tmp_path / "model.safetensors"
    foreign.write_bytes((trained_run / "checkpoint.pt").read_bytes())
    with pytest.raises(CheckpointError):
        load_packed(foreign)
