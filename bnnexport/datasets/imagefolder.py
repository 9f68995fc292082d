"""Images from a local folder, in one of two layouts:

- ROOT/train/CLASS/*.jpg and ROOT/val/CLASS/*.jpg (ImageNet's);
- ROOT/CLASS/*.png, with `val_split` (`--val-split`): that fraction of each class, drawn with a
  fixed seed, is the validation set.

Class indices follow the sorted class-folder names (of train/ in the first layout; val/ must
use the same names), recorded as `DatasetSplits.class_names`; a class folder without images
is refused (skipping it would renumber every class after it). Grayscale images become RGB, the
gray value in all 3 channels, and the loader says so in its note. `image_size`
(`--image-size`) says how an image becomes the model's input, with PIL and NumPy only (no
torchvision); sizes are height x width:
- None (the default): every image at its own size, when all of them (training and validation)
  share one, H x W; no crop, no resize, and for training a horizontal flip with probability
  1/2. The loader says so in `DatasetSplits.note`. Images of different sizes are a DataError
  that asks for an `image_size`. Only each file's header is read to learn its size.
- N, or (H, W) (`--image-size 32`, `40x48`, `40,48`): every image resized whole to N x N or
  H x W (no crop), and the same flip for training: small images keep their content.
- "imagenet" (`--image-size imagenet`, what the ImageNet recipes set): ImageNet's
  preprocessing at 224 (`size`), train: a random-resized crop (8-100 % of the area, aspect
  ratio 3/4-4/3) resized to 224 and the flip; val: the shorter side resized to size / 0.875
  (256 for 224), then a center crop.
Every side is at least 4 pixels. `DatasetSplits.options` holds the options that rebuild this
very data, the size chosen included (N, [H, W] or "imagenet"): `train` records them in
config.json's `dataset_options`, so export and --resume rebuild the same inputs. Pixels are
scaled to [-1, 1] like the other data sets, or with `mean` and `std` (per channel, for pixels
in [0, 1]) to (x - mean) / std. Decoding happens in `__getitem__`, so
`TrainConfig.num_workers` loads in worker processes.

Example:
    >>> from bnnexport.datasets import load_dataset
    >>> data = load_dataset("imagefolder", "imagenet/", image_size="imagenet")  # doctest: +SKIP
    >>> data.input_shape                                                    # doctest: +SKIP
    (3, 224, 224)
    >>> data = load_dataset("imagefolder", "tex/", val_split=0.2)  # doctest: +SKIP
    >>> data.input_shape, data.options                          # doctest: +SKIP
    ((3, 40, 48), {'image_size': [40, 48], 'val_split': 0.2})
    >>> parse_image_size("40x48"), parse_image_size("32,32"), parse_image_size("imagenet")
    ([40, 48], 32, 'imagenet')
"""

from __future__ import annotations

import numbers
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from bnnexport.datasets.splits import DatasetSplits
from bnnexport.errors import DataError

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")
IMAGE_SIZE = 224  # ImageNet's crops: side in pixels (the ImageNet models' native input)
IMAGENET = "imagenet"  # the image_size that asks for ImageNet's crops
MIN_SIDE = 4  # pixels: below it no model of the zoo, nor a 3x3 convolution and a pool, fits
_SPLIT_SEED = 20261125  # fixed: a plain folder's validation images must not change between runs


def _scan(split_dir: Path, classes: list[str]) -> list[tuple[Path, int]]:
    """(image, class index) of every image of every class folder; DataError for a class folder
    that is missing or holds no image. An empty one is refused, not skipped: skipped, every
    class after it would take another index than its place among the folders, and the model
    one output fewer than the folders it was given."""
    samples = []
    for index, name in enumerate(classes):
        folder = split_dir / name
        if not folder.is_dir():
            raise DataError(f"{split_dir} lacks the class folder {name!r} that train/ has")
        found = [(p, index) for p in sorted(folder.iterdir()) if p.suffix.lower() in EXTENSIONS]
        if not found:
            raise DataError(
                f"class folder {folder} holds no images ({', '.join(EXTENSIONS)}): every class "
                "folder is one output of the model, in sorted order; fill it or remove it"
            )
        samples += found
    return samples


GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")  # PIL modes with one gray channel


def _grayscale_note(root: Path, samples: list[tuple[Path, int]]) -> str | None:
    """One line when the first image of a class is grayscale: every image is converted to RGB
    (the gray value in all 3 channels), so the model takes 3 channels. Only each class's first
    file's header is read."""
    from PIL import Image

    firsts = {label: path for path, label in reversed(samples)}  # each class's first image
    for path in (firsts[label] for label in sorted(firsts)):
        try:
            with Image.open(path) as image:
                mode = image.mode
        except OSError as error:
            raise DataError(f"cannot read image {path}: {error}") from None
        if mode in GRAYSCALE_MODES:
            return (
                f"{path.relative_to(root)} is grayscale (mode {mode}): every image is converted "
                "to RGB, its gray value in all 3 channels, so the model takes 3 channels"
            )
    return None


def _to_tensor(image, normalize: tuple[np.ndarray, np.ndarray] | None = None) -> torch.Tensor:
    array = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)
    if normalize is None:
        return torch.from_numpy(array / 127.5 - 1.0)
    mean, std = normalize
    return torch.from_numpy((array / 255.0 - mean[:, None, None]) / std[:, None, None])


class ImageFolder(Dataset):
    """(path, class) pairs decoded and preprocessed on access; see the module docstring.

    `size`: the output (height, width); `resize`: resize whole images to it instead of
    ImageNet's crops (which are square: size[0]); `normalize`: per-channel (mean, std) for
    pixels in [0, 1], None for [-1, 1].
    """

    def __init__(
        self,
        samples: list[tuple[Path, int]],
        size: tuple[int, int],
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

        side = self.size[0]
        width, height = image.size
        short = max(1, round(side / 0.875))
        scale = short / min(width, height)
        image = image.resize(
            (max(side, round(width * scale)), max(side, round(height * scale))), Image.BILINEAR
        )
        left = (image.size[0] - side) // 2
        top = (image.size[1] - side) // 2
        return image.crop((left, top, left + side, top + side))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.samples[index]
        try:
            with Image.open(path) as opened:
                image = opened.convert("RGB")
        except OSError as error:
            raise DataError(f"cannot read image {path}: {error}") from None
        height, width = self.size
        if self.resize:  # PIL returns a copy, not a resampled image, at the same size
            image = image.resize((width, height), Image.BILINEAR)
        elif self.train:
            image = self._random_resized_crop(image).resize((width, height), Image.BILINEAR)
        else:
            image = self._center_crop(image)
        if self.train and np.random.rand() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        return _to_tensor(image, self.normalize), label


def parse_image_size(value: Any) -> int | list[int] | str:
    """An image size as config.json records it: N for N x N, [H, W] (height, width) when they
    differ, or "imagenet" for ImageNet's crops. Takes that form, an (H, W) pair, or text:
    "N", "HxW", "H,W", "imagenet". DataError, one line, for anything else or a side below 4.

    >>> parse_image_size(32), parse_image_size((32, 32)), parse_image_size("40X48")
    (32, 32, [40, 48])
    """
    if isinstance(value, str):
        text = value.strip().lower()
        if text == IMAGENET:
            return IMAGENET
        parts = re.fullmatch(r"(\d+)(?:\s*[x,]\s*(\d+))?", text)
        sides = [int(p) for p in parts.groups() if p is not None] if parts else []
    else:
        sides = list(value) if isinstance(value, (list, tuple)) else [value]
    if not (1 <= len(sides) <= 2 and all(_is_integer(v) for v in sides)):
        raise DataError(f"--image-size {value}: give N, HxW or H,W (height, width) in pixels, "
                        f"or {IMAGENET} for ImageNet's 224 crops")  # fmt: skip
    sides = [int(v) for v in sides]
    if min(sides) < MIN_SIDE:
        raise DataError(f"--image-size {value}: every side must be at least {MIN_SIDE} pixels")
    height, width = sides * (3 - len(sides))
    return height if height == width else [height, width]


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _sides(image_size: int | list[int]) -> tuple[int, int]:
    """(height, width) of a size in parse_image_size's form."""
    return (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)


def _common_size(root: Path, samples: list[tuple[Path, int]]) -> tuple[int, int]:
    """The (height, width) every image has; DataError naming two that differ. PIL reads only
    each file's header here: nothing is decoded."""
    from PIL import Image

    first: tuple[Path, tuple[int, int]] | None = None
    for path, _ in samples:
        try:
            with Image.open(path) as image:
                width, height = image.size
        except OSError as error:
            raise DataError(f"cannot read image {path}: {error}") from None
        if first is None:
            first = path, (height, width)
        elif first[1] != (height, width):
            (h, w), name = first[1], first[0].relative_to(root)
            raise DataError(
                f"the images in {root} differ in size ({name} is {h}x{w}, "
                f"{path.relative_to(root)} is {height}x{width}, height x width): pass "
                "--image-size N, HxW or H,W to resize every image to one size, or "
                f"--image-size {IMAGENET} for ImageNet's 224 crops"
            )
    assert first is not None  # _scan refuses a split without images
    return first[1]


def _own_size(root: Path, samples: list[tuple[Path, int]]) -> tuple[int | list[int], str]:
    """The size every image has, in parse_image_size's form, and the line that says so."""
    height, width = _common_size(root, samples)
    if min(height, width) < MIN_SIDE:
        raise DataError(f"every image in {root} is {height}x{width} (height x width), under "
                        f"{MIN_SIDE} pixels a side: --image-size N enlarges them")  # fmt: skip
    note = (f"every image in {root} is {height}x{width} (height x width): training at that "
            "size (--image-size N, HxW or imagenet to change it)")  # fmt: skip
    return parse_image_size((height, width)), note


def load_imagefolder(
    data_dir: str | Path | None,
    augment: bool = True,
    size: int | None = None,
    image_size: int | tuple[int, int] | list[int] | str | None = None,
    mean: list[float] | None = None,
    std: list[float] | None = None,
    val_split: float | None = None,
) -> DatasetSplits:
    """ROOT/train/CLASS/* and ROOT/val/CLASS/*, or ROOT/CLASS/* with `val_split`; see the
    module docstring. `size`: the side of ImageNet's crops (224), and with it image_size
    "imagenet". DataError (one line) for a wrong layout or option."""
    if data_dir is None:
        raise DataError("imagefolder needs --data-dir: ROOT/train/CLASS/ and ROOT/val/CLASS/, or "
                        "ROOT/CLASS/ with --val-split")  # fmt: skip
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"data directory not found: {root}")
    if size is not None:
        if image_size not in (None, IMAGENET):
            raise DataError(f"size {size} is the side of ImageNet's crops, not for "
                            f"image_size {image_size}")  # fmt: skip
        image_size = IMAGENET
    chosen = None if image_size is None else parse_image_size(image_size)
    normalize = _normalization(mean, std)
    train_samples, test_samples, classes = _split_layout(root, val_split)
    if len(classes) < 2:  # one class trains to accuracy 1.0 and means nothing
        raise DataError(f"{root} needs at least 2 class folders, found only {classes[0]!r}")
    note = None
    if chosen is None:
        chosen, note = _own_size(root, train_samples + test_samples)
    gray = _grayscale_note(root, train_samples)
    note = "\n".join(n for n in (note, gray) if n) or None
    if chosen == IMAGENET:
        shape, resize = (size or IMAGE_SIZE,) * 2, False
    else:
        shape, resize = _sides(chosen), True
    train = ImageFolder(train_samples, shape, augment, resize, normalize)
    test = ImageFolder(test_samples, shape, False, resize, normalize)
    given = {"image_size": chosen, "mean": mean, "std": std, "val_split": val_split}
    options = {key: value for key, value in given.items() if value is not None}
    return DatasetSplits(
        "imagefolder", train, test, len(classes), (3, *shape), options, note, class_names=classes
    )


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
