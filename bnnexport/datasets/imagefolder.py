"""Images from a local folder, in one of two layouts:

- ROOT/train/CLASS/*.jpg and ROOT/val/CLASS/*.jpg (ImageNet's);
- ROOT/CLASS/*.png, with `val_split` (`--val-split`): that fraction of each class, drawn with a
  fixed seed, is the validation set.

Class indices follow the sorted class-folder names (of train/ in the first layout; val/ must
use the same names). Preprocessing, with PIL and NumPy only (no torchvision):
- by default (ImageNet), train: a random-resized crop (8-100 % of the area, aspect ratio
  3/4-4/3), resized to 224 (`size`), and a horizontal flip with probability 1/2; val: resize
  the shorter side to size / 0.875 (256 for 224), then a center crop;
- with `image_size` N (`--image-size`): every image resized whole to N x N (no crop), and for
  training a horizontal flip with probability 1/2: small images keep their content.
Pixels are scaled to [-1, 1] like the other data sets, or with `mean` and `std` (per channel,
for pixels in [0, 1]) to (x - mean) / std. Decoding happens in `__getitem__`, so
`TrainConfig.num_workers` loads in worker processes.

Example:
    >>> from bnnexport.datasets import load_dataset
    >>> data = load_dataset("imagefolder", "/data/imagenet")   # doctest: +SKIP
    >>> data.input_shape                                        # doctest: +SKIP
    (3, 224, 224)
    >>> data = load_dataset("imagefolder", "tex/", image_size=32, val_split=0.2)  # doctest: +SKIP
    >>> data.input_shape                                        # doctest: +SKIP
    (3, 32, 32)
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
_SPLIT_SEED = 20261125  # fixed: a plain folder's validation images must not change between runs


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


def _to_tensor(image, normalize: tuple[np.ndarray, np.ndarray] | None = None) -> torch.Tensor:
    array = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)
    if normalize is None:
        return torch.from_numpy(array / 127.5 - 1.0)
    mean, std = normalize
    return torch.from_numpy((array / 255.0 - mean[:, None, None]) / std[:, None, None])


class ImageFolder(Dataset):
    """(path, class) pairs decoded and preprocessed on access; see the module docstring.

    `resize`: resize whole images to size x size (`image_size`) instead of ImageNet's crops;
    `normalize`: per-channel (mean, std) for pixels in [0, 1], None for [-1, 1].
    """

    def __init__(
        self,
        samples: list[tuple[Path, int]],
        size: int,
        train: bool,
        resize: bool = False,
        normalize: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.samples = samples
        self.size = size
        self.train = train
        self.resize = resize
        self.normalize = normalize

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
        if self.resize:
            image = image.resize((self.size, self.size), Image.BILINEAR)
        elif self.train:
            image = self._random_resized_crop(image).resize((self.size, self.size), Image.BILINEAR)
        else:
            image = self._center_crop(image)
        if self.train and np.random.rand() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        return _to_tensor(image, self.normalize), label


def load_imagefolder(
    data_dir: str | Path | None,
    augment: bool = True,
    size: int | None = None,
    image_size: int | None = None,
    mean: list[float] | None = None,
    std: list[float] | None = None,
    val_split: float | None = None,
) -> DatasetSplits:
    """ROOT/train/CLASS/* and ROOT/val/CLASS/*, or ROOT/CLASS/* with `val_split`; see the
    module docstring. DataError (one line) for a wrong layout or option."""
    if data_dir is None:
        raise DataError("imagefolder needs --data-dir: ROOT/train/CLASS/ and ROOT/val/CLASS/, or "
                        "ROOT/CLASS/ with --val-split")  # fmt: skip
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"data directory not found: {root}")
    normalize = _normalization(mean, std)
    train_samples, test_samples, classes = _split_layout(root, val_split)
    if len(classes) < 2:  # one class trains to accuracy 1.0 and means nothing
        raise DataError(f"{root} needs at least 2 class folders, found only {classes[0]!r}")
    side = image_size or size or IMAGE_SIZE
    resize = image_size is not None
    train = ImageFolder(train_samples, side, augment, resize, normalize)
    test = ImageFolder(test_samples, side, False, resize, normalize)
    return DatasetSplits("imagefolder", train, test, len(classes), (3, side, side))


def _normalization(
    mean: list[float] | None, std: list[float] | None
) -> tuple[np.ndarray, np.ndarray] | None:
    if mean is None and std is None:
        return None
    if mean is None or std is None:
        raise DataError("--mean and --std go together (per channel, for pixels in [0, 1])")
    values = [np.asarray(v, np.float32).reshape(-1) for v in (mean, std)]
    if any(len(v) not in (1, 3) for v in values):
        raise DataError(f"--mean {mean} --std {std}: give 1 or 3 values (R,G,B) each")
    if not (np.all(np.isfinite(values[0])) and np.all(values[1] > 0)):
        raise DataError(f"--mean {mean} --std {std}: finite means and std > 0 only")
    mean_3, std_3 = (np.broadcast_to(v, (3,)).copy() for v in values)
    return mean_3, std_3


def _split_layout(
    root: Path, val_split: float | None
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]], list[str]]:
    """(train samples, validation samples, class names) of either layout."""
    has_splits = [s for s in ("train", "val") if (root / s).is_dir()]
    if has_splits:
        if val_split is not None:
            raise DataError(f"--val-split is for a plain ROOT/CLASS/ folder; {root} has train/")
        if len(has_splits) == 1:
            missing = {"train", "val"} - set(has_splits)
            raise DataError(f"{root} is not an image folder: missing {missing.pop()}/")
        classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
        if not classes:
            raise DataError(f"{root / 'train'} has no class folders")
        return _scan(root / "train", classes), _scan(root / "val", classes), classes
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{root} has neither train/ and val/ nor class folders")
    if val_split is None:
        raise DataError(f"{root} has class folders but no train/ and val/: pass --val-split "
                        "FRACTION to hold out that part of each class for validation")  # fmt: skip
    if not 0.0 < val_split < 1.0:
        raise DataError(f"--val-split {val_split}: must be between 0 and 1 (exclusive)")
    return _held_out(_scan(root, classes), val_split) + (classes,)


def _held_out(
    samples: list[tuple[Path, int]], fraction: float
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]]]:
    """Per class, a seeded `fraction` of the images (at least one, never all) for validation."""
    rng = np.random.default_rng(_SPLIT_SEED)
    train, val = [], []
    for label in sorted({label for _, label in samples}):
        members = [s for s in samples if s[1] == label]
        if len(members) < 2:
            raise DataError(f"{members[0][0].parent} needs 2 images or more to split")
        count = min(len(members) - 1, max(1, round(fraction * len(members))))
        order = rng.permutation(len(members))
        val += [members[k] for k in sorted(order[:count])]
        train += [members[k] for k in sorted(order[count:])]
    return train, val
