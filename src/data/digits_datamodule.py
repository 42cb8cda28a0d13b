"""scikit-learn's 1,797 handwritten 8x8 digits: the tiniest real dataset, for quick experiments and tests."""

import torch
from torch.utils.data import Dataset

from src.data.datamodule import seeded_split
from src.data.in_memory_datamodule import InMemoryDataModule, normalized_dataset


class DigitsDataModule(InMemoryDataModule):
    """UCI optical digits as bundled with scikit-learn, split by `split` with a fixed `split_seed`."""

    name = "digits"

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        # Imported here: scikit-learn is only needed for this dataset.
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.from_numpy(digits.images).float().unsqueeze(1) / 16.0  # pixel values are 0..16
        labels = torch.from_numpy(digits.target)
        self._check_labels(labels)
        dataset = normalized_dataset(images, labels, self.hparams.mean, self.hparams.std)
        train, val, test = seeded_split(dataset, self.hparams.split, self.hparams.split_seed, self.name)
        return train, val, test
