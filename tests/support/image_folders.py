"""Small synthetic ImageFolder trees for the data set tests."""

from __future__ import annotations

import numpy as np
from PIL import Image


def write_image_folder(root, classes=("cat", "dog", "emu"), per_class=4, size=(48, 40)):
    """ROOT/train and ROOT/val, one folder per class of PNGs, each class its own mean colour."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for index, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for k in range(per_class):
                # each class has its own mean colour, so a label mix-up would show
                pixels = np.clip(rng.normal(60 + 60 * index, 10, (*size[::-1], 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{k}.png")
    return root


def tiny_training(root) -> list[str]:
    """`train` options for mnist-bnn on a 12-image folder of 16x16 pictures written under ROOT:
    an epoch in a fraction of a second, for tests of what training prints and writes."""
    data = write_image_folder(root)
    return ["--dataset", "imagefolder", "--data-dir", str(data), "--image-size", "16",
            "--batch-size", "4"]  # fmt: skip
