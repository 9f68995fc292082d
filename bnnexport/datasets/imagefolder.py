"""ImageNet-style data from a local folder: ROOT/train/CLASS/*.jpg and ROOT/val/CLASS/*.jpg.

Class indices follow the sorted class-folder names of train/ (val/ must use the same names).
Preprocessing, with PIL and NumPy only (no torchvision):
- train: a random-resized crop (8-100 % of the area, aspect ratio 3/4-4/3), resized to the
  output size, and a horizontal flip with probability 1/2;
- val: resize the shorter side to size / 0.875 (256 for 224), then a center crop.
Pixels are scaled to [-1, 1] like the other data sets. Decoding happens in `__getitem__`, so
`TrainConfig.num_workers` loads in worker processes.

Example:
    >>> from bnnexport.datasets import load_dataset
    >>> data = load_dataset("imagefolder", "/data/imagenet")   # doctest: +SKIP
    >>> data.input_shape                                        # doctest: +SKIP
    (3, 224, 224)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from bnnexport.datasets.splits import DatasetSplits
from bnnexport.errors import DataError

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")
IMAGE_SIZE = 224  # output side in pixels (the ImageNet models' native input)


def _scan(split_dir: Path, classes: list[str]) -> list[tuple[Path, int]]:
    samples = []
    for index, name in enumerate(classes):
        folder = split_dir / name
        if not folder.is_dir():
            raise DataError(f"{split_dir} lacks the class folder {name!r} that train/ has")
        samples += [(p, index) for p in sorted(folder.iterdir()) if p.suffix.lower() in EXTENSIONS]
    if not samples:
        raise DataError(f"{split_dir} holds no images ({', '.join(EXTENSIONS)})")
    return samples


def _to_tensor(image) -> torch.Tensor:
    array = np.asarray(image.convert("RGB"), dtype=np.float32)
    return torch.from_numpy(array.transpose(2, 0, 1) / 127.5 - 1.0)


class ImageFolder(Dataset):
    """(path, class) pairs decoded and preprocessed on access; see the module docstring."""

    def __init__(self, samples: list[tuple[Path, int]], size: int, train: bool) -> None:
        self.samples = samples
        self.size = size
        self.train = train

    def __len__(self) -> int:
        return len(self.samples)

    def _random_resized_crop(self, image):
        width, height = image.size
        area = width * height
        for _ in range(10):  # as torchvision: try, then fall back to a center crop
            target = area * np.random.uniform(0.08, 1.0)
            ratio = np.exp(np.random.uniform(np.log(3 / 4), np.log(4 / 3)))
            w = int(round(np.sqrt(target * ratio)))
            h = int(round(np.sqrt(target / ratio)))
            if 0 < w <= width and 0 < h <= height:
                left = np.random.randint(0, width - w + 1)
                top = np.random.randint(0, height - h + 1)
                return image.crop((left, top, left + w, top + h))
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        return image.crop((left, top, left + side, top + side))

    def _center_crop(self, image):
        from PIL import Image

        width, height = image.size
        short = max(1, round(self.size / 0.875))
        scale = short / min(width, height)
        image = image.resize(
            (max(self.size, round(width * scale)), max(self.size, round(height * scale))),
            Image.BILINEAR,
        )
        left = (image.size[0] - self.size) // 2
        top = (image.size[1] - self.size) // 2
        return image.crop((left, top, left + self.size, top + self.size))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.samples[index]
        try:
            with Image.open(path) as opened:
                image = opened.convert("RGB")
        except OSError as error:
            raise DataError(f"cannot read image {path}: {error}") from None
        if self.train:
            image = self._random_resized_crop(image).resize((self.size, self.size), Image.BILINEAR)
            if np.random.rand() < 0.5:
                image = image.transpose(Image.FLIP_LEFT_RIGHT)
        else:
            image = self._center_crop(image)
        return _to_tensor(image), label


def load_imagefolder(
    data_dir: str | Path | None, augment: bool = True, size: int | None = None
) -> DatasetSplits:
    """ROOT/train/CLASS/* and ROOT/val/CLASS/*; DataError (one line) for a wrong layout."""
    if data_dir is None:
        raise DataError("imagefolder needs --data-dir pointing at a folder with train/ and val/")
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"data directory not found: {root}")
    missing = [s for s in ("train", "val") if not (root / s).is_dir()]
    if missing:
        raise DataError(f"{root} is not an image folder: missing {' and '.join(missing)}/")
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{root / 'train'} has no class folders")
    size = size or IMAGE_SIZE
    train = ImageFolder(_scan(root / "train", classes), size, train=augment)
    test = ImageFolder(_scan(root / "val", classes), size, train=False)
    if len(classes) < 2:  # one class trains to accuracy 1.0 and means nothing
        raise DataError(
            f"{root / 'train'} needs at least 2 class folders, found only {classes[0]!r}"
        )
    return DatasetSplits("imagefolder", train, test, len(classes), (3, size, size))
