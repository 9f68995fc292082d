"""Data sets, offline: the MNIST subset shipped in the package and CIFAR-10 from a local folder.

Pixels are scaled to [-1, 1]. Nothing is ever downloaded. In: a name (or `module:loader`) and
a folder. Out: `DatasetSplits`. It may import `bnnexport.imports` and torch; nothing else of
bnnexport.

- ``mnist5k``: 5,000 MNIST digits (500 per class) shipped as `mnist5k.npz`; a deterministic,
  stratified split of 4,000 training and 1,000 test images.
- ``cifar10``: the python version (`cifar-10-batches-py`: `data_batch_1..5`, `test_batch`) in
  `--data-dir`, with the paper's augmentation for training: pad 4, random 32x32 crop, horizontal
  flip.

Example:
    >>> from bnnexport.datasets import load_dataset
    >>> data = load_dataset("mnist5k")
    >>> len(data.train), len(data.test), data.num_classes, data.input_shape
    (4000, 1000, 10, (1, 28, 28))
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from bnnexport.datasets.imagefolder import IMAGENET, load_imagefolder
from bnnexport.datasets.splits import DatasetSplits
from bnnexport.errors import DataError
from bnnexport.imports import call_with_accepted, import_object, is_import_string

MNIST5K_TEST_PER_CLASS = 100
_SPLIT_SEED = 20190101  # fixed forever: the mnist5k test set must never change


def to_signed_unit(images: np.ndarray) -> torch.Tensor:
    """uint8 pixels (N, C, H, W) -> float32 in [-1, 1]."""
    return torch.from_numpy(images.astype(np.float32) / 127.5 - 1.0)


def load_mnist5k(data_dir: str | Path | None = None, augment: bool = True) -> DatasetSplits:
    """The shipped 5,000-image MNIST subset, split 4,000 / 1,000 (100 test images per class)."""
    with resources.files("bnnexport.datasets").joinpath("mnist5k.npz").open("rb") as handle:
        archive = np.load(handle)
        images, labels = archive["images"], archive["labels"].astype(np.int64)
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(labels))
    test_mask = np.zeros(len(labels), dtype=bool)
    for cls in range(10):
        members = order[labels[order] == cls]
        test_mask[members[:MNIST5K_TEST_PER_CLASS]] = True
    x = to_signed_unit(images[:, None, :, :])
    y = torch.from_numpy(labels)
    train = TensorDataset(x[~test_mask], y[~test_mask])
    test = TensorDataset(x[test_mask], y[test_mask])
    digits = [str(d) for d in range(10)]
    return DatasetSplits("mnist5k", train, test, 10, (1, 28, 28), class_names=digits)


class AugmentedImages(Dataset):
    """uint8 NCHW images with the paper's CIFAR augmentation: pad 4, random crop, flip."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, pad: int = 4) -> None:
        self.images = images
        self.labels = torch.from_numpy(labels.astype(np.int64))
        self.pad = pad

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = to_signed_unit(self.images[index])
        _, height, width = image.shape
        # Torch-style zero padding of the [-1, 1] image: the padded border reads as mid-grey.
        padded = torch.nn.functional.pad(image, (self.pad,) * 4)
        top, left = np.random.randint(0, 2 * self.pad + 1, size=2)
        crop = padded[:, top : top + height, left : left + width]
        if np.random.rand() < 0.5:
            crop = crop.flip(-1)
        return crop, self.labels[index]


# The only globals a real CIFAR-10 batch refers to: how numpy rebuilds its `data` array (and
# `_codecs.encode`, which Python 3 uses for bytes at pickle protocol 2 when a batch is re-saved).
# The dict, lists, ints, bytes and str it also holds need no global at all.
_CIFAR_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}  # fmt: skip


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles plain data and numpy arrays only: a crafted batch file cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _CIFAR_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with path.open("rb") as handle:
            # The official CIFAR-10 distribution is a pickle: allow only what a real batch holds.
            batch = _CifarUnpickler(handle, encoding="bytes").load()
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as error:
        raise DataError(f"{path} is not a plain CIFAR-10 python batch ({error})") from None
    except Exception as error:
        raise DataError(f"{path} is not a CIFAR-10 python batch ({type(error).__name__})") from None
    try:
        data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except Exception as error:
        raise DataError(f"{path} is not a CIFAR-10 python batch ({type(error).__name__})") from None
    if len(data) != len(labels):
        raise DataError(f"{path}: {len(data)} images but {len(labels)} labels")
    return data, labels


# CIFAR-10's label names in label order, as its batches.meta lists them
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck"]  # fmt: skip


def load_cifar10(data_dir: str | Path | None, augment: bool = True) -> DatasetSplits:
    """CIFAR-10 from a local `cifar-10-batches-py` directory (or its parent)."""
    if data_dir is None:
        raise DataError("cifar10 needs --data-dir pointing at a cifar-10-batches-py directory")
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"data directory not found: {root}")
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise DataError(
            f"{root} is not a cifar-10-batches-py directory: missing {', '.join(missing)}"
        )
    parts = [_read_cifar_batch(root / n) for n in names[:5]]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x, test_y = _read_cifar_batch(root / "test_batch")
    train: Dataset = (
        AugmentedImages(train_x, train_y)
        if augment
        else TensorDataset(to_signed_unit(train_x), torch.from_numpy(train_y))
    )
    test = TensorDataset(to_signed_unit(test_x), torch.from_numpy(test_y))
    return DatasetSplits("cifar10", train, test, 10, (3, 32, 32), class_names=CIFAR10_CLASSES)


_LOADERS: dict[str, Callable[..., DatasetSplits]] = {
    "mnist5k": load_mnist5k,
    "cifar10": load_cifar10,
}


def register_dataset(name: str, loader: Callable[..., DatasetSplits]) -> None:
    """Make `loader(data_dir, augment)` available as `--dataset name`."""
    _LOADERS[name] = loader


def list_datasets() -> list[str]:
    """Names accepted by `load_dataset`."""
    return sorted(_LOADERS)


def load_dataset(
    name: str, data_dir: str | Path | None = None, augment: bool = True, **options: Any
) -> DatasetSplits:
    """Load a data set by name; a missing or malformed directory raises `DataError`.

    `name` may be an import string, `module:loader` (`bnnexport.imports`): a loader of your
    own, called as `loader(data_dir, augment=augment)` (as far as its signature takes them)
    and returning a `DatasetSplits`. `options` go to the loader (imagefolder: image_size,
    mean, std, val_split); `DatasetSplits.options` are those that rebuild the same data, with
    what the loader chose itself (imagefolder: the images' own size).
    """
    if is_import_string(name):
        loader = import_object(name, "--dataset")
        data = call_with_accepted(
            loader, f"--dataset {name}", data_dir=data_dir, augment=augment, **options
        )
        if not isinstance(data, DatasetSplits):
            raise DataError(
                f"--dataset {name} returned {type(data).__name__}, not a "
                "bnnexport.datasets.splits.DatasetSplits"
            )
        return _require_declared_shape(data, f"--dataset {name}")
    if name not in _LOADERS:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(list_datasets())}")
    return _LOADERS[name](data_dir, augment=augment, **options)


def _require_declared_shape(data: DatasetSplits, what: str) -> DatasetSplits:
    """`data`, once the first sample of each split has the `input_shape` it declares (a model
    is built for the declared shape, so a wrong one would fail deep inside its forward)."""
    declared = tuple(int(v) for v in data.input_shape)
    for split in ("train", "test"):
        dataset = getattr(data, split)
        if len(dataset) == 0:  # type: ignore[arg-type]
            raise DataError(f"{what}: its {split} split holds no samples")
        shape = tuple(dataset[0][0].shape)
        if shape != declared:
            raise DataError(
                f"{what} declares input_shape {list(declared)}, but its first {split} sample "
                f"has shape {list(shape)}"
            )
    return data


def recorded_options(dataset: str, options: dict[str, Any]) -> dict[str, Any]:
    """The loader options a run recorded (config.json's dataset_options), as `load_dataset`
    takes them today: an imagefolder run that recorded no image_size was made before the
    default became the images' own size, on ImageNet's crops.

    >>> recorded_options("imagefolder", {"val_split": 0.2})
    {'val_split': 0.2, 'image_size': 'imagenet'}
    """
    if dataset == "imagefolder" and "image_size" not in options:
        return {**options, "image_size": IMAGENET}
    return options


register_dataset("imagefolder", load_imagefolder)
