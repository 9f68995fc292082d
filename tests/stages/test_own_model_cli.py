"""Your data and your model from the CLI: `--model module:factory`, `--dataset module:loader`
and imagefolder's --image-size, --mean/--std and --val-split. A bad value of any of them is one
line, exit 2, and the run directory is left as it was; a plain folder of 32x32 images trains at
its own size with a model defined outside bnnexport (tests/support/handwritten_bnn.py), and export,
convert, bench and --resume find both again from what the run recorded. Without --image-size,
images that share one size train at it (said in one line) and the run records it; images of
several sizes are one line asking for --image-size; the ImageNet recipes keep ImageNet's crops."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image
from support.cli import run_in_process
from support.guarantees import assert_one_line_error, besides_epoch_lines
from support.image_folders import write_plain_folder

from bnnexport.run.checkpoint import load_checkpoint

MODULE = "support.handwritten_bnn"  # a model defined outside bnnexport
MODEL = f"{MODULE}:hand_written_bnn"


@pytest.fixture(scope="module")
def plain_folder(tmp_path_factory):
    return write_plain_folder(tmp_path_factory.mktemp("images") / "textures")


@pytest.fixture(scope="module")
def split_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("split") / "data"
    write_plain_folder(root / "train", per_class=2)
    write_plain_folder(root / "val", per_class=2)
    return root


BAD = {
    "model-import": (["--model", "no_such_module_26:factory"], "cannot import no_such_module_26"),
    "model-attribute": (["--model", f"{MODULE}:nothing"], "has no attribute 'nothing'"),
    "model-not-a-module": (["--model", f"{MODULE}:KERNELS"], "not a function to call"),
    "model-unknown-name": (["--model", "no-such-net"], "nor an import string module:factory"),
    "model-raises": (["--model", "support.handwritten_bnn:failing_factory"],
                     "failed: ValueError: no model for 10 classes here"),
    "dataset-import": (["--dataset", "no_such_module_26:load"], "cannot import no_such_module_26"),
    "dataset-not-splits": (["--dataset", "support.handwritten_bnn:hand_written_bnn"],
                           "returned HandWrittenBNN, not a"),
    "image-size-small": (["--dataset", "imagefolder", "--image-size", "2", "--val-split", "0.5"],
                         "--image-size 2: every side must be at least 4 pixels"),
    "image-size-side-small": (["--dataset", "imagefolder", "--image-size", "40x3"],
                              "--image-size 40x3: every side must be at least 4 pixels"),
    "image-size-text": (["--dataset", "imagefolder", "--image-size", "abc"],
                        "--image-size abc: give N, HxW or H,W (height, width)"),
    "image-size-three": (["--dataset", "imagefolder", "--image-size", "4x4x4"],
                         "--image-size 4x4x4: give N, HxW or H,W"),
    "image-size-mnist": (["--image-size", "32"], "of --dataset imagefolder, not of mnist5k"),
    "mean-alone": (["--dataset", "imagefolder", "--val-split", "0.5", "--mean", "0.5"],
                   "--mean and --std go together"),
    "std-zero": (["--dataset", "imagefolder", "--val-split", "0.5", "--mean", "0.5", "--std", "0"],
                 "std > 0"),
    "mean-count": (["--dataset", "imagefolder", "--val-split", "0.5", "--mean", "1,2",
                    "--std", "1,2"], "give 1 or 3 values"),
    "mean-text": (["--dataset", "imagefolder", "--mean", "grey"], "not a comma-separated list"),
    "val-split-range": (["--dataset", "imagefolder", "--val-split", "1.5"],
                        "--val-split 1.5: must be between 0 and 1"),
    "val-split-missing": (["--dataset", "imagefolder"], "pass --val-split FRACTION"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_option_is_one_line_exit_2_and_leaves_the_run_directory_alone(
    case, plain_folder, tmp_path
):
    args, message = BAD[case]
    if "imagefolder" in args:
        args = [*args, "--data-dir", str(plain_folder)]
    out = tmp_path / "run"
    result = run_in_process("train", *args, "--epochs", "1", "--out", str(out))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert message in lines[0], lines[0]
    assert not out.exists()


def test_val_split_on_a_train_val_folder_is_refused(split_folder, tmp_path):
    out = tmp_path / "run"
    result = run_in_process("train", "--dataset", "imagefolder", "--data-dir", str(split_folder),
                            "--val-split", "0.2", "--out", str(out))  # fmt: skip
    assert result.returncode == 2 and "--val-split is for a plain ROOT/CLASS/ folder" in (
        result.stderr
    )
    assert not out.exists()


def test_a_plain_folder_splits_per_class_with_a_fixed_seed(plain_folder):
    from bnnexport.datasets import load_dataset

    first = load_dataset("imagefolder", plain_folder, image_size=16, val_split=0.34)
    again = load_dataset("imagefolder", plain_folder, image_size=16, val_split=0.34)
    assert (len(first.train), len(first.test), first.input_shape) == (12, 6, (3, 16, 16))
    assert [s for s in first.test.samples] == [s for s in again.test.samples]
    assert sorted(label for _, label in first.test.samples) == [0, 0, 1, 1, 2, 2]
    assert not {p for p, _ in first.test.samples} & {p for p, _ in first.train.samples}


def test_mean_and_std_scale_pixels_per_channel(plain_folder):
    from bnnexport.datasets import load_dataset

    signed = load_dataset("imagefolder", plain_folder, image_size=8, val_split=0.5)
    scaled = load_dataset("imagefolder", plain_folder, image_size=8, val_split=0.5,
                          mean=[0.5, 0.5, 0.5], std=[0.25, 0.5, 1.0])  # fmt: skip
    x, y = signed.test[0][0], scaled.test[0][0]  # x = p/127.5 - 1 = 2(p/255 - 0.5)
    np.testing.assert_allclose(y.numpy(), (x / 2 / np.array([0.25, 0.5, 1.0])[:, None, None]),
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def _train_own(folder, out, *extra: str):
    return run_in_process(
        "train", "--model", MODEL, "--dataset", "imagefolder", "--data-dir", str(folder),
        "--image-size", "32", "--val-split", "0.34", "--epochs", "1", "--batch-size", "6",
        "--init-sign", "--out", str(out), "--json", *extra,
    )  # fmt: skip


@pytest.mark.slow
def test_own_model_trains_at_its_own_image_size_and_export_and_resume_find_it(
    plain_folder, tmp_path
):
    out = tmp_path / "own"
    result = _train_own(plain_folder, out)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # w1, w2: 16x16x3x3 each; fc: 3 classes x 16 channels x (32/4)^2 (224 would be 3 x 16 x 56^2)
    assert report["binary_parameters"] == 2 * 16 * 16 * 9 + 3 * 16 * 8 * 8
    assert report["strict"] is True
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == MODEL and config["dataset"] == "imagefolder"
    assert config["dataset_options"] == {"image_size": 32, "val_split": 0.34}
    exported = run_in_process("export", str(out), "--json")
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["binary_layers"] == 3
    resumed = run_in_process("train", "--out", str(out), "--resume", "--epochs", "2", "--json")
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["epochs"] == 2
    changed = run_in_process("train", "--out", str(out), "--resume", "--epochs", "3",
                             "--image-size", "64")  # fmt: skip
    assert changed.returncode == 2 and "differs from the run's" in changed.stderr


@pytest.mark.slow
@pytest.mark.long
def test_own_model_on_own_images_exports_converts_and_benches(plain_folder, tmp_path):
    out = tmp_path / "own"
    assert _train_own(plain_folder, out).returncode == 0
    for command in (["export"], ["convert"], ["bench", "--runs", "5"]):
        result = run_in_process(*command, str(out), "--json")
        assert result.returncode == 0, (command, result.stderr)
    converted = json.loads((out / "convert.json").read_text())
    assert converted["lce_bconv2d"] == converted["binary_layers"] == 3
    bench = json.loads((out / "bench.json").read_text())
    assert {row["name"] for row in bench["backends"]} >= {"pytorch", "onnxruntime", "lce"}


# Your images at their own size: no --image-size

SMALL = (40, 48)  # height, width: not square, so a swap would show


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory):
    return write_plain_folder(tmp_path_factory.mktemp("small") / "small", per_class=3, size=SMALL)


def _train_small(folder, out, *extra: str):
    # adam-latent: the hand-written model's real-valued kernels need no --init-sign (a warning)
    return run_in_process(
        "train", "--model", MODEL, "--optimizer", "adam-latent", "--dataset", "imagefolder",
        "--data-dir", str(folder), "--val-split", "0.34", "--epochs", "1", "--batch-size", "3",
        "--out", str(out), *extra,
    )  # fmt: skip


def _input_shape(run) -> list[int]:
    """The input shape the run's model was built for."""
    return list(load_checkpoint(run / "checkpoint.pt")["model_kwargs"]["input_shape"])


NOTE = "is 40x48 (height x width): training at that size (--image-size N, HxW or imagenet"


@pytest.mark.slow
def test_images_of_one_size_train_at_it_and_say_so_in_one_line(small_folder, tmp_path):
    out = tmp_path / "run"
    result = _train_small(small_folder, out)
    assert result.returncode == 0, result.stderr
    assert besides_epoch_lines(result.stderr) == [
        f"bnnexport: note: every image in {small_folder} {NOTE} to change it)"
    ]
    assert _input_shape(out) == [3, 40, 48]
    config = json.loads((out / "config.json").read_text())
    assert config["dataset_options"] == {"image_size": [40, 48], "val_split": 0.34}


@pytest.mark.slow
def test_with_json_the_size_note_is_in_the_report(small_folder, tmp_path):
    result = _train_small(small_folder, tmp_path / "run", "--json")
    assert result.returncode == 0 and besides_epoch_lines(result.stderr) == [], result.stderr
    (note,) = json.loads(result.stdout)["notes"]
    assert NOTE in note
    assert json.loads((tmp_path / "run" / "train.json").read_text())["notes"] == [note]


def test_images_of_several_sizes_without_image_size_are_one_line_exit_2(small_folder, tmp_path):
    folder = shutil.copytree(small_folder, tmp_path / "mixed")
    Image.new("RGB", (32, 32)).save(folder / "plain" / "2.png")
    out = tmp_path / "run"
    assert_one_line_error(_train_small(folder, out), 2, "differ in size", "dots/0.png is 40x48",
                          "plain/2.png is 32x32", "pass --image-size")  # fmt: skip
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("spelling", ["40x48", "40,48"])
def test_image_size_h_by_w_builds_the_model_for_h_by_w(plain_folder, tmp_path, spelling):
    out = tmp_path / "run"
    result = _train_small(plain_folder, out, "--image-size", spelling)  # 32x32 images
    assert result.returncode == 0 and besides_epoch_lines(result.stderr) == [], result.stderr
    assert _input_shape(out) == [3, 40, 48]
    assert json.loads((out / "config.json").read_text())["dataset_options"]["image_size"] == [
        40, 48
    ]  # fmt: skip


@pytest.mark.slow
def test_resume_and_export_rebuild_the_data_at_the_recorded_size(small_folder, tmp_path):
    folder = shutil.copytree(small_folder, tmp_path / "images")
    out = tmp_path / "run"
    assert _train_small(folder, out).returncode == 0
    # images of another size added since: the recorded size is used, not learnt again
    for name in ("dots", "stripes"):  # one each: 8 training images, no batch of one
        Image.new("RGB", (32, 32), "white").save(folder / name / "9.png")
    resumed = run_in_process("train", "--out", str(out), "--resume", "--epochs", "2", "--json")
    assert resumed.returncode == 0 and besides_epoch_lines(resumed.stderr) == [], resumed.stderr
    assert json.loads(resumed.stdout)["epochs"] == 2
    assert run_in_process("export", str(out), "--json").returncode == 0
    assert np.load(out / "samples.npz")["inputs"].shape[1:] == (3, 40, 48)


@pytest.mark.slow
def test_resume_takes_the_recorded_size_again_and_refuses_another(small_folder, tmp_path):
    out = tmp_path / "run"
    assert _train_small(small_folder, out).returncode == 0
    # the recorded size alone, beside the run's other options (its --val-split), is no change
    same = run_in_process("train", "--out", str(out), "--resume", "--epochs", "2",
                          "--image-size", "40,48")  # fmt: skip
    assert same.returncode == 0, same.stderr
    other = run_in_process("train", "--out", str(out), "--resume", "--epochs", "3",
                           "--image-size", "32")  # fmt: skip
    assert_one_line_error(other, 2, "--image-size 32 differs from the run's [40, 48]")


@pytest.mark.slow
def test_the_imagenet_recipe_keeps_imagenets_224_crops(plain_folder, tmp_path):
    out = tmp_path / "run"
    result = run_in_process(
        "train", "--recipe", "paper-imagenet-bop", "--model", MODEL, "--optimizer",
        "adam-latent", "--data-dir", str(plain_folder), "--val-split", "0.34", "--epochs", "1",
        "--batch-size", "6", "--out", str(out), "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert _input_shape(out) == [3, 224, 224]  # the 32x32 images' own size would be 32
    config = json.loads((out / "config.json").read_text())
    assert config["dataset_options"] == {  # the authors' pixel mean and std come with it
        "image_size": "imagenet", "val_split": 0.34,
        "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
    }  # fmt: skip
