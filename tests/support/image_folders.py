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


CLASSES = ("dots", "stripes", "plain")


def write_plain_folder(root, per_class: int = 6, size: int | tuple[int, int] = 32):
    """ROOT/CLASS/*.png: three synthetic classes at `size` (N, or (height, width)), each its
    own pattern."""
    shape = (size, size) if isinstance(size, int) else tuple(size)
    rng = np.random.default_rng(0)
    grid = np.indices(shape).sum(axis=0)
    patterns = [grid % 4 == 0, np.indices(shape)[1] % 6 < 3, np.zeros(shape, bool)]
    for name, pattern in zip(CLASSES, patterns, strict=True):
        (root / name).mkdir(parents=True)
        for k in range(per_class):
            base = np.where(pattern, 220, 40)[..., None] + rng.normal(0, 12, (*shape, 3))
            Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(root / name / f"{k}.png")
    return root


def tiny_training(root) -> list[str]:
    """`train` options for mnist-bnn on a 12-image folder of 16x16 pictures written under ROOT:
    an epoch in a fraction of a second, for tests of what training prints and writes."""
    data = write_image_folder(root)
    return ["--dataset", "imagefolder", "--data-dir", str(data), "--image-size", "16",
            "--batch-size", "4"]  # fmt: skip


def write_flat_folder(root, per_class: int = 24, size: int = 28):
    """ROOT/CLASS/*.png: three classes of one bright shape (square, bar, cross) at a jittered
    place on a background of ONE grey level, RGB: a flat background as MNIST's, where every
    background pixel gives every layer the same value (ties are common there)."""
    rng = np.random.default_rng(0)
    for name in ("square", "bar", "cross"):
        (root / name).mkdir(parents=True)
        for k in range(per_class):
            pixels = np.full((size, size), 30.0)
            r, c = rng.integers(4, size - 12, 2)
            if name == "square":
                pixels[r : r + 8, c : c + 8] = 220
            elif name == "bar":
                pixels[r : r + 10, c + 3 : c + 5] = 220
            else:
                pixels[r + 4 : r + 6, c : c + 10] = pixels[r : r + 10, c + 4 : c + 6] = 220
            rgb = np.repeat(pixels[..., None], 3, axis=2).astype(np.uint8)
            Image.fromarray(rgb).save(root / name / f"{k}.png")
    return root
