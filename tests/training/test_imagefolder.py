"""--dataset imagefolder: ROOT/train|val/CLASS/*.png read with PIL, random-resized crop and flip
for training, resize + center crop for validation, loaded in worker processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.image_folders import write_image_folder
from torch.utils.data import DataLoader

from bnnexport.datasets import list_datasets, load_dataset
from bnnexport.datasets.imagefolder import load_imagefolder
from bnnexport.errors import DataError


def test_imagefolder_is_registered():
    assert "imagefolder" in list_datasets()


def test_layout_classes_shapes_and_pixel_range(tmp_path):
    data = load_imagefolder(write_image_folder(tmp_path), size=32)
    assert (data.num_classes, data.input_shape) == (3, (3, 32, 32))
    assert len(data.train) == len(data.test) == 12
    image, label = data.test[11]
    assert image.shape == (3, 32, 32) and label == 2
    assert -1.0 <= float(image.min()) and float(image.max()) <= 1.0
    # class 2 was drawn around 180 -> (180 / 127.5 - 1) ≈ 0.41
    assert abs(float(image.mean()) - 0.41) < 0.1


def test_validation_crop_is_deterministic_and_training_crop_random(tmp_path):
    data = load_imagefolder(write_image_folder(tmp_path, per_class=1), size=24)
    torch.testing.assert_close(data.test[0][0], data.test[0][0])
    np.random.seed(0)
    crops = {tuple(data.train[0][0].flatten()[:20].tolist()) for _ in range(5)}
    assert len(crops) > 1


def test_loads_in_worker_processes(tmp_path):
    data = load_imagefolder(write_image_folder(tmp_path), size=16)
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
