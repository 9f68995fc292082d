"""--dataset imagefolder: ROOT/train|val/CLASS/*.png read with PIL at the images' own size when
they share one (learnt from the headers alone), resized whole to --image-size N or HxW, or with
ImageNet's crops (random-resized crop and flip for training, resize + center crop for validation)
under --image-size imagenet; loaded in worker processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile
from support.image_folders import write_image_folder
from torch.utils.data import DataLoader

from bnnexport.datasets import list_datasets, load_dataset, recorded_options
from bnnexport.datasets.imagefolder import load_imagefolder, parse_image_size
from bnnexport.errors import DataError


def test_imagefolder_is_registered():
    assert "imagefolder" in list_datasets()


def test_layout_classes_shapes_and_pixel_range(tmp_path):
    data = load_imagefolder(write_image_folder(tmp_path), image_size="imagenet", size=32)
    assert (data.num_classes, data.input_shape) == (3, (3, 32, 32))
    assert len(data.train) == len(data.test) == 12
    image, label = data.test[11]
    assert image.shape == (3, 32, 32) and label == 2
    assert -1.0 <= float(image.min()) and float(image.max()) <= 1.0
    # class 2 was drawn around 180 -> (180 / 127.5 - 1) ≈ 0.41
    assert abs(float(image.mean()) - 0.41) < 0.1


def test_validation_crop_is_deterministic_and_training_crop_random(tmp_path):
    data = load_imagefolder(write_image_folder(tmp_path, per_class=1), image_size="imagenet",
                            size=24)  # fmt: skip
    torch.testing.assert_close(data.test[0][0], data.test[0][0])
    np.random.seed(0)
    crops = {tuple(data.train[0][0].flatten()[:20].tolist()) for _ in range(5)}
    assert len(crops) > 1


def test_loads_in_worker_processes(tmp_path):
    data = load_imagefolder(write_image_folder(tmp_path), image_size=16)
    batches = list(DataLoader(data.train, batch_size=4, num_workers=2))
    assert sum(len(labels) for _, labels in batches) == 12
    assert batches[0][0].shape == (4, 3, 16, 16)


@pytest.mark.parametrize(
    "layout, message",
    [("missing", "data directory not found"), ("no-val", "missing val/"),
     ("empty", "holds no images"), (None, "needs --data-dir")],
)  # fmt: skip
def test_wrong_layouts_are_one_line_data_errors(tmp_path, layout, message):
    root = tmp_path / "data"
    if layout == "no-val":
        (root / "train" / "a").mkdir(parents=True)
    elif layout == "empty":
        (root / "train" / "a").mkdir(parents=True)
        (root / "val" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match=message) as error:
        load_dataset("imagefolder", None if layout is None else root)
    assert "\n" not in str(error.value)


def test_images_of_one_size_load_at_that_size_unchanged_and_the_loader_says_so(tmp_path):
    root = write_image_folder(tmp_path / "data", size=(48, 40))  # PIL's (width, height)
    data = load_dataset("imagefolder", root)
    assert data.input_shape == (3, 40, 48) and data.test[0][0].shape == (3, 40, 48)
    assert data.options == {"image_size": [40, 48]}  # what rebuilds the same data
    assert f"every image in {root} is 40x48 (height x width)" in data.note
    assert "\n" not in data.note
    path, _ = data.test.samples[0]
    pixels = np.asarray(Image.open(path).convert("RGB"), np.float32).transpose(2, 0, 1)
    np.testing.assert_allclose(data.test[0][0].numpy(), pixels / 127.5 - 1.0, atol=1e-6)


def test_training_at_the_own_size_flips_but_never_crops(tmp_path):
    data = load_dataset("imagefolder", write_image_folder(tmp_path / "data", per_class=1))
    path, _ = data.train.samples[0]
    pixels = np.asarray(Image.open(path).convert("RGB"), np.float32).transpose(2, 0, 1)
    exact = torch.from_numpy(pixels / 127.5 - 1.0)
    np.random.seed(0)
    seen = {tuple(data.train[0][0].flatten().tolist()) for _ in range(8)}
    assert seen == {tuple(exact.flatten().tolist()), tuple(exact.flip(-1).flatten().tolist())}


def test_learning_the_size_decodes_no_image(tmp_path, monkeypatch):
    root = write_image_folder(tmp_path / "data")

    def decode(self):
        raise AssertionError(f"{self.filename} was decoded to learn its size")

    monkeypatch.setattr(ImageFile.ImageFile, "load", decode)
    assert load_dataset("imagefolder", root).input_shape == (3, 40, 48)


def test_images_of_different_sizes_ask_for_image_size_in_one_line(tmp_path):
    root = write_image_folder(tmp_path / "data", size=(48, 40))
    Image.new("RGB", (32, 32)).save(root / "val" / "emu" / "3.png")
    with pytest.raises(DataError, match="--image-size") as error:
        load_dataset("imagefolder", root)
    message = str(error.value)
    assert "train/cat/0.png is 40x48" in message and "val/emu/3.png is 32x32" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "value, recorded",
    [("40x48", [40, 48]), ("40,48", [40, 48]), ("40X48", [40, 48]), ("32", 32), ("32x32", 32),
     (32, 32), ((40, 48), [40, 48]), ([32, 32], 32), ("imagenet", "imagenet")],
)  # fmt: skip
def test_image_size_spellings_and_the_form_a_run_records(value, recorded):
    assert parse_image_size(value) == recorded


@pytest.mark.parametrize("value", ["abc", "40x", "40x48x2", "-5", "4.5", 4.5, True, (40, 48, 2),
                                   "3", "40x3", (40, 0)])  # fmt: skip
def test_a_bad_image_size_is_one_line(value):
    with pytest.raises(DataError, match=r"^--image-size .*(give N, HxW|at least 4 pixels)"):
        parse_image_size(value)


def test_image_size_h_w_resizes_every_image_whole(tmp_path):
    data = load_dataset("imagefolder", write_image_folder(tmp_path / "data"), image_size=(20, 24))
    assert data.input_shape == (3, 20, 24) and data.train[0][0].shape == (3, 20, 24)
    assert data.options == {"image_size": [20, 24]} and data.note is None


def test_image_size_imagenet_takes_imagenets_224_crops(tmp_path):
    data = load_dataset("imagefolder", write_image_folder(tmp_path / "data", per_class=1),
                        image_size="imagenet")  # fmt: skip
    assert data.input_shape == (3, 224, 224) and data.test[0][0].shape == (3, 224, 224)
    np.random.seed(0)
    crops = {tuple(data.train[0][0][:, :4, :4].flatten().tolist()) for _ in range(5)}
    assert len(crops) > 1  # random-resized crops, not one resized image
    assert data.options == {"image_size": "imagenet"} and data.note is None


def test_a_run_recorded_without_an_image_size_rebuilds_imagenets_crops(tmp_path):
    """Runs made before the images' own size became the default recorded no image_size."""
    root = write_image_folder(tmp_path / "data", per_class=1)
    options = recorded_options("imagefolder", {})
    assert load_dataset("imagefolder", root, **options).input_shape == (3, 224, 224)


def test_the_class_names_are_the_folders_in_the_order_of_their_indices(tmp_path):
    data = load_imagefolder(write_image_folder(tmp_path, classes=("emu", "cat", "dog")), 16)
    assert data.class_names == ["cat", "dog", "emu"]
    path, label = data.train.samples[-1]
    assert path.parent.name == "emu" and label == 2


@pytest.mark.parametrize("split", ["train", "val"])
def test_an_empty_class_folder_is_refused_in_one_line_naming_it(tmp_path, split):
    root = write_image_folder(tmp_path / "data")
    for name in ("train", "val"):
        (root / name / "fox").mkdir()
    (root / ("val" if split == "train" else "train") / "fox" / "0.png").write_bytes(
        (root / "train" / "cat" / "0.png").read_bytes()
    )
    with pytest.raises(DataError) as error:
        load_imagefolder(root, image_size=16)
    message = str(error.value)
    assert f"class folder {root / split / 'fox'} holds no images" in message
    assert "fill it or remove it" in message and "\n" not in message


def test_a_grayscale_folder_says_in_one_line_that_it_becomes_rgb(tmp_path):
    root = write_image_folder(tmp_path / "data")
    for path in root.rglob("*.png"):
        Image.open(path).convert("L").save(path)
    data = load_imagefolder(root, image_size=16)
    assert data.input_shape == (3, 16, 16)
    assert "train/cat/0.png is grayscale (mode L): every image is converted to RGB" in data.note
    assert "\n" not in data.note
    assert load_imagefolder(write_image_folder(tmp_path / "rgb"), image_size=16).note is None
