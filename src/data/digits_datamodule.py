"""scikit-learn's 1,797 handwritten 8x8 digits: the tiniest real dataset, for quick experiments and tests."""

import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from src.data.in_memory_datamodule import InMemoryDataModule


def sklearn_digits_csv_path() -> Path:
    """Where scikit-learn keeps the digits (found without importing scikit-learn, which imports pandas: a
    third of a second at every start)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("data=digits needs the scikit-learn package: pip install scikit-learn")
    return Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"


class DigitsDataModule(InMemoryDataModule):
    """UCI optical digits as bundled with scikit-learn, split by `split` with a fixed `split_seed`."""

    name = "digits"

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        # One row per digit: its 64 pixels, then its label (what sklearn.datasets.load_digits reads).
        rows = np.loadtxt(sklearn_digits_csv_path(), delimiter=",", dtype=np.float32)
        images = torch.from_numpy(rows[:, :-1]).reshape(-1, 1, 8, 8) / 16.0  # pixel values are 0..16
        return self.split_images(images, torch.from_numpy(rows[:, -1].astype(np.int64)))
