"""Built-in datasets, read from where the machine keeps them (never downloaded at run time)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..registry import Registry
from .idx import read_idx

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


@dataclass(frozen=True)
class Dataset:
    """Arrays of a built-in dataset: float32 images scaled to [0, 1] and int64 labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    classes: tuple[str, ...] = ()
    #: the stored 8-bit images (x = uint8 / 255), when the format has them
    x_train_uint8: np.ndarray | None = None
    x_test_uint8: np.ndarray | None = None


DATASETS: Registry[Dataset] = Registry("dataset")


def _idx_dir(env_var: str, default: Path, package: str) -> Path:
    root = Path(os.environ.get(env_var, default))
    if not root.is_dir():
        raise DataError(
            f"dataset directory {str(root)!r} does not exist. Install the Debian package "
            f"`{package}` (`apt-get install -y {package}`, which `make demo`/`make test` do when run as root) "
            f"or set {env_var} to a directory holding the four IDX .gz files."
        )
    return root


def load_idx_dataset(
    root: Path, name: str, classes: tuple[str, ...] = (), limit: int | None = None
) -> Dataset:
    def raw(stem: str) -> np.ndarray:
        arr = read_idx(_find(root, stem))
        return arr[:limit] if limit else arr

    x_train, x_test = raw("train-images-idx3-ubyte")[:, None], raw("t10k-images-idx3-ubyte")[:, None]
    return Dataset(
        name,
        x_train.astype(np.float32) / 255.0,
        raw("train-labels-idx1-ubyte").astype(np.int64),
        x_test.astype(np.float32) / 255.0,
        raw("t10k-labels-idx1-ubyte").astype(np.int64),
        10,
        classes,
        x_train_uint8=x_train,
        x_test_uint8=x_test,
    )


def _find(root: Path, stem: str) -> Path:
    for candidate in (root / f"{stem}.gz", root / stem):
        if candidate.exists():
            return candidate
    raise DataError(
        f"{stem}(.gz) is missing from {str(root)!r}; the directory holds: "
        f"{', '.join(sorted(p.name for p in root.iterdir())) or 'nothing'}."
    )


@DATASETS("fashion-mnist", description="Zalando Fashion-MNIST, 60k/10k 28x28 grey images, 10 classes")
def fashion_mnist(limit: int | None = None) -> Dataset:
    root = _idx_dir("SPARKDP_FASHION_MNIST", FASHION_MNIST_DIR, "dataset-fashion-mnist")
    return load_idx_dataset(root, "fashion-mnist", FASHION_MNIST_CLASSES, limit)


def load_dataset(name: str, **kwargs) -> Dataset:
    return DATASETS.create(name, **kwargs)


def dataset_tensors(dataset: Dataset):
    """Train and test :class:`TensorData` for a built-in dataset, shipped as uint8 when exact.

    Images are stored as k/255 floats; sending them as uint8 with ``divisor=255`` gives the
    workers bit-identical batches for a quarter of the bytes in every task closure.
    """
    from .tensors import TensorData

    def pack(x: np.ndarray, x8: np.ndarray | None, y: np.ndarray) -> TensorData:
        # float32(k) / 255 is correctly rounded in numpy and torch alike: identical batches
        return TensorData(x8, y, divisor=255.0) if x8 is not None else TensorData(x, y)

    return (
        pack(dataset.x_train, dataset.x_train_uint8, dataset.y_train),
        pack(dataset.x_test, dataset.x_test_uint8, dataset.y_test),
    )
