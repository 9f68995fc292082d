"""bnnexport owns only the files it wrote: a manifest of content hashes, not a list of names.

Every case ends by checking the user's files byte for byte (docs/RELIABILITY.md, "Ownership").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.cli import invoke
from support.converter_nets import StemAndBinaryConv, export
from support.guarantees import assert_one_line_error, benched, snapshot

from bnnexport.errors import ForeignFileError
from bnnexport.run import files, provenance

# every name bnnexport gives a file, plus a twin, a bench plot and a file in a subfolder
ARTIFACT_NAMES = (
    "config.json", "checkpoint.pt", "metrics.jsonl", "train.json", "accuracy.png",
    "flip_rate.png", "verify.json", "model.safetensors", "pack.json", "samples.npz",
    "model.onnx", "export.json", "model-arm64.tflite", "model-arm64-b4.tflite",
    "model-float.tflite", "convert.json", "bench.json", "report.md", "bench_mine.png",
    "bench_device.log", "provenance.json",
)  # fmt: skip
INIT = ["init", "--model", "binarynet", "--input-shape", "3,16,16"]


def users_folder(root: Path) -> Path:
    """A folder of the user's own files, each named like one of bnnexport's artifacts."""
    root.mkdir()
    for name in ARTIFACT_NAMES:
        (root / name).write_bytes(f"the user's own {name}\n".encode())
    (root / "provenance.json").write_text('{"mine": true}\n')
    (root / "sub").mkdir()
    (root / "sub" / "notes.txt").write_text("notes\n")
    return root


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_train_in_a_folder_of_user_files_named_like_artifacts_is_refused(tmp_path, force):
    proj = users_folder(tmp_path / "proj")
    before = snapshot(proj)
    args = ["train", "--epochs", "1", "--out", str(proj)] + (["--force"] if force else [])
    line = assert_one_line_error(invoke(*args), 2)
    assert "not a run directory" in line and "accuracy.png" in line and "more" in line
    assert snapshot(proj) == before


def test_init_in_a_folder_of_user_files_named_like_artifacts_is_refused(tmp_path):
    proj = users_folder(tmp_path / "proj")
    before = snapshot(proj)
    assert_one_line_error(invoke(*INIT, "--out", str(proj), "--force"), 2)
    assert snapshot(proj) == before


def test_an_edited_artifact_is_the_users_and_force_refuses_to_delete_it(tmp_path):
    run = tmp_path / "run"
    assert invoke(*INIT, "--out", str(run)).exit_code == 0
    (run / "config.json").write_text('{"edited": "by hand"}\n')
    before = snapshot(run)
    line = assert_one_line_error(invoke(*INIT, "--out", str(run), "--force"), 2)
    assert "config.json" in line
    line = assert_one_line_error(invoke("train", "--epochs", "1", "--out", str(run), "--force"), 2)
    assert "config.json" in line
    assert snapshot(run) == before


def test_a_user_file_in_a_subfolder_of_a_run_is_refused(tmp_path):
    run = tmp_path / "run"
    assert invoke(*INIT, "--out", str(run)).exit_code == 0
    (run / "mine").mkdir()
    (run / "mine" / "data.bin").write_bytes(bytes(range(256)))
    before = snapshot(run)
    assert "mine/" in assert_one_line_error(invoke(*INIT, "--out", str(run), "--force"), 2)
    assert snapshot(run) == before


def test_force_deletes_every_file_the_manifest_lists_whatever_its_name(tmp_path):
    run = tmp_path / "run"
    assert invoke(*INIT, "--out", str(run)).exit_code == 0
    files.write_bytes_atomic(run / "model-arm64-b4.tflite", b"a batch-4 copy of the old model")
    files.write_bytes_atomic(run / "bench_some_backend.png", b"a plot of the old model")
    assert invoke(*INIT, "--out", str(run), "--force", "--seed", "1").exit_code == 0
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoint.pt",
        "config.json",
        "provenance.json",
    ]
    assert files.foreign_files(run) == []


def test_a_twin_of_any_name_made_from_the_old_model_goes_with_it(tmp_path):
    for name, payload in [("checkpoint.pt", b"c"), ("model.onnx", b"o")]:
        files.write_bytes_atomic(tmp_path / name, payload)
    files.write_bytes_atomic(tmp_path / "model-arm64-b8.tflite", b"twin")
    provenance.record(tmp_path, "model-arm64-b8.tflite", ["model.onnx"])
    removed = provenance.remove_derived(tmp_path, "checkpoint.pt")
    assert "model-arm64-b8.tflite" in removed and "model.onnx" in removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "provenance.json"]


def test_bench_results_report_and_plots_go_with_the_checkpoint_they_measured(tmp_path):
    run = tmp_path / "run"
    assert invoke(*INIT, "--out", str(run)).exit_code == 0
    made = benched(run, (3, 16, 16))
    assert {"bench.json", "report.md", "bench_latency.png"} <= set(made)
    assert sorted(provenance.remove_derived(run, "checkpoint.pt")) == made
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.json",
                                                     "provenance.json"]  # fmt: skip


def test_an_append_only_file_stays_ours_while_its_recorded_bytes_are_its_prefix(tmp_path):
    log = tmp_path / "metrics.jsonl"
    files.write_bytes_atomic(log, b'{"step": 1}\n', append=True)
    with log.open("ab") as handle:  # what train appends between two records
        handle.write(b'{"step": 2}\n')
    assert files.owns(log)
    log.write_bytes(b'{"step": 9}\n{"step": 2}\n')  # the recorded prefix edited
    assert not files.owns(log)


def test_a_foreign_manifest_makes_the_folder_off_limits(tmp_path):
    (tmp_path / "provenance.json").write_text('{"mine": true}\n')
    with pytest.raises(ForeignFileError, match="not its manifest"):
        files.write_bytes_atomic(tmp_path / "report.md", b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["provenance.json"]


def test_remove_checks_every_file_before_deleting_any(tmp_path):
    files.write_bytes_atomic(tmp_path / "a.json", b"1")
    files.write_bytes_atomic(tmp_path / "b.json", b"2")
    (tmp_path / "b.json").write_bytes(b"edited")
    with pytest.raises(ForeignFileError, match="b.json changed since"):
        files.remove([tmp_path / "a.json", tmp_path / "b.json"])
    assert (tmp_path / "a.json").read_bytes() == b"1"


def test_convert_module_refuses_to_replace_a_foreign_model_onnx(tmp_path):
    from bnnexport import convert_module

    folder = tmp_path / "ow"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"the user's own ONNX model")
    before = snapshot(folder)
    with pytest.raises(ForeignFileError, match="model.onnx was not written by bnnexport"):
        convert_module(StemAndBinaryConv(), torch.randn(1, 2, 7, 7), out=folder / "model.tflite")
    assert snapshot(folder) == before


@pytest.mark.slow
def test_convert_module_replaces_its_own_files_and_shows_its_steps(tmp_path, capsys):
    from bnnexport import convert_module

    out = tmp_path / "net-arm64.tflite"
    convert_module(StemAndBinaryConv(), torch.randn(1, 2, 7, 7), out=out, progress=False)
    assert capsys.readouterr().err == ""
    torch.manual_seed(1)
    convert_module(
        StemAndBinaryConv(), torch.randn(1, 2, 7, 7), out=out, progress=True
    )  # ours: replaced
    steps = [line.split(":")[1].split()[0] for line in capsys.readouterr().err.splitlines()]
    assert steps == ["torch.onnx.export", "normalise", "translate", "gate", "exact-grid"]
    assert files.foreign_files(tmp_path) == []


def _dynamic_batch_onnx(path: Path) -> Path:
    return export(
        StemAndBinaryConv(), (1, 2, 7, 7), path, input_names=["x"], dynamic_axes={"x": {0: "n"}}
    )


@pytest.mark.slow
def test_convert_at_another_batch_writes_its_own_file(tmp_path):
    onnx_path = _dynamic_batch_onnx(tmp_path / "dyn.onnx")
    result = invoke("convert", str(onnx_path), "--batch", "2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["output"] == str(tmp_path / "dyn-arm64-b2.tflite") and report["batch"] == 2
    assert not (tmp_path / "dyn-arm64.tflite").exists()


def test_batch_on_a_model_of_fixed_batch_is_one_line(tmp_path):
    onnx_path = export(StemAndBinaryConv(), (1, 2, 7, 7), tmp_path / "fixed.onnx")
    before = snapshot(tmp_path)
    line = assert_one_line_error(invoke("convert", str(onnx_path), "--batch", "2"), 2)
    assert "fixed batch of 1" in line
    assert snapshot(tmp_path) == before


def test_convert_refuses_to_replace_a_users_flatbuffer_before_converting(tmp_path):
    onnx_path = export(StemAndBinaryConv(), (1, 2, 7, 7), tmp_path / "net.onnx")
    (tmp_path / "net-arm64.tflite").write_bytes(b"the user's flatbuffer")
    before = snapshot(tmp_path)
    assert "net-arm64.tflite" in assert_one_line_error(invoke("convert", str(onnx_path)), 2)
    assert snapshot(tmp_path) == before


def test_convert_beside_a_foreign_manifest_writes_nothing_before_converting(tmp_path):
    """The folder's provenance.json is the user's: the line says nothing is written there,
    and nothing is (once a flatbuffer was left behind, converted before the manifest was read)."""
    onnx_path = export(StemAndBinaryConv(), (1, 2, 7, 7), tmp_path / "net.onnx")
    (tmp_path / "provenance.json").write_text('{"mine": true}\n')
    before = snapshot(tmp_path)
    line = assert_one_line_error(invoke("convert", str(onnx_path)), 2)
    assert "provenance.json" in line and "writes nothing into" in line
    assert snapshot(tmp_path) == before


def test_convert_of_a_folder_that_is_not_a_run_is_refused_and_changes_nothing(tmp_path):
    """A folder of the user's own model.onnx and samples, no checkpoint.pt: not written into
    (no convert.json, no manifest, no flatbuffer gated on random inputs)."""
    proj = tmp_path / "proj"
    proj.mkdir()
    export(StemAndBinaryConv(), (1, 2, 7, 7), proj / "model.onnx")
    (proj / "samples.npz").write_bytes(b"the user's samples")
    before = snapshot(proj)
    line = assert_one_line_error(invoke("convert", str(proj)), 2)
    assert "not a bnnexport run directory (no checkpoint.pt)" in line and "--out" in line
    assert snapshot(proj) == before


@pytest.mark.parametrize(
    "out, fragment",
    [
        ("net.onnx.txt", "name a .tflite file"),  # not a flatbuffer's name
        ("notes.txt/net.tflite", "notes.txt is a file, not a folder"),  # below a file
        ("mine.tflite", "mine.tflite was not written by bnnexport"),  # the user's flatbuffer
        ("folder", "is a directory"),  # a folder
    ],
    ids=["suffix", "below-a-file", "users-file", "folder"],
)
def test_convert_out_refuses_a_path_it_cannot_write_in_one_line(tmp_path, out, fragment):
    onnx_path = export(StemAndBinaryConv(), (1, 2, 7, 7), tmp_path / "net.onnx")
    (tmp_path / "notes.txt").write_text("the user's notes\n")
    (tmp_path / "mine.tflite").write_bytes(b"the user's flatbuffer")
    (tmp_path / "folder").mkdir()
    before = snapshot(tmp_path)
    line = assert_one_line_error(invoke("convert", str(onnx_path), "--out", str(tmp_path / out)), 2)
    assert fragment in line
    assert snapshot(tmp_path) == before


def test_convert_out_with_a_run_directory_is_one_line(tmp_path):
    run = tmp_path / "run"
    assert invoke(*INIT, "--out", str(run)).exit_code == 0
    before = snapshot(tmp_path)
    line = assert_one_line_error(
        invoke("convert", str(run), "--out", str(tmp_path / "x.tflite")), 2
    )
    assert "--out" in line and "model-arm64.tflite" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "out, fragment",
    [("net.tflite", "name an .onnx file"), ("mine.onnx", "mine.onnx was not written")],
    ids=["suffix", "users-file"],
)
def test_export_out_refuses_a_path_it_cannot_write_before_exporting(tmp_path, out, fragment):
    run = tmp_path / "run"
    assert invoke(*INIT, "--out", str(run)).exit_code == 0
    (tmp_path / "mine.onnx").write_bytes(b"the user's own model")
    before = snapshot(tmp_path)
    line = assert_one_line_error(invoke("export", str(run), "--out", str(tmp_path / out)), 2)
    assert fragment in line
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_export_out_writes_the_onnx_where_asked_and_leaves_the_run_as_it_is(tmp_path):
    run = tmp_path / "run"
    assert invoke(*INIT, "--out", str(run)).exit_code == 0
    assert invoke("export", str(run), "--samples", "8").exit_code == 0
    before = snapshot(run)
    out = tmp_path / "elsewhere" / "net.onnx"
    result = invoke("export", str(run), "--samples", "8", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output[-1500:]
    assert json.loads(result.stdout)["onnx"] == str(out)
    assert snapshot(run) == before  # model.onnx, samples.npz, export.json: the run's own
    assert sorted(p.name for p in out.parent.iterdir()) == ["net.onnx", "provenance.json"]
    assert out.read_bytes() == (run / "model.onnx").read_bytes()  # the same export
    assert files.foreign_files(out.parent) == []
