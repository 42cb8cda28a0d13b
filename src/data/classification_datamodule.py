"""Base of the classification datamodules: (image, class index) samples, the class count checked against the
labels."""

from collections.abc import Sequence
from typing import Any

import torch

from src.data.datamodule import DataModule


class ClassificationDataModule(DataModule):
    """A DataModule (see there) of `(image, label)` samples with `num_classes` classes: a subclass implements
    `load_datasets` and may check its labels with `_check_labels`."""

    task = "classification"

    def __init__(self, num_classes: int, input_shape: Sequence[int], **settings: Any) -> None:
        """`settings`: the DataModule's (split, batch_size, num_workers, ...; see there)."""
        super().__init__(input_shape=input_shape, **settings)

    def _check_labels(self, labels: torch.Tensor) -> None:
        found = int(labels.max()) + 1
        if found != self.hparams.num_classes:
            raise ValueError(
                f"data.num_classes={self.hparams.num_classes} but {self.name} has {found} classes; "
                f"fix data.num_classes in the data config"
            )
