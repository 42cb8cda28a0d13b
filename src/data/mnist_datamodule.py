"""The full MNIST (60,000 train + 10,000 test digits) through torchvision, downloaded into `data_dir`."""

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from src.data.datamodule import seeded_split
from src.data.in_memory_datamodule import InMemoryDataModule, normalized_dataset

IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


class MNISTDataModule(InMemoryDataModule):
    """torchvision's MNIST: the official test set for test; the training set split into train/val."""

    name = "mnist"

    def __init__(self, download: bool = True, **kwargs: Any) -> None:
        """`download`: fetch the files when missing; the other arguments are those of InMemoryDataModule."""
        super().__init__(**kwargs)
        self.download = download

    @property
    def raw_dir(self) -> Path:
        return Path(self.hparams.data_dir) / "MNIST" / "raw"

    def _mnist(self, train: bool):
        from torchvision.datasets import MNIST

        try:
            return MNIST(self.hparams.data_dir, train=train, download=self.download)
        except RuntimeError as err:
            raise FileNotFoundError(
                f"MNIST is not in {self.raw_dir} and could not be downloaded ({err}). Put the four "
                f"uncompressed IDX files {', '.join(IDX_FILES)} in {self.raw_dir}, or choose data=mnist5k"
            ) from None

    def prepare_data(self) -> None:
        self._mnist(train=True)
        self._mnist(train=False)

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        pool, test = self._mnist(train=True), self._mnist(train=False)
        self._check_labels(pool.targets)
        mean, std = self.hparams.mean, self.hparams.std
        pool_data = normalized_dataset(pool.data.unsqueeze(1) / 255.0, pool.targets, mean, std)
        train, val = seeded_split(pool_data, self.hparams.split, self.hparams.split_seed, self.name)
        test_data = normalized_dataset(test.data.unsqueeze(1) / 255.0, test.targets, mean, std)
        return train, val, test_data
