"""Base of the classification datamodules: (image, class index) samples, the class count checked against the
labels."""

from collections.abc import Sequence

import torch

from src.data.datamodule import DataModule


class ClassificationDataModule(DataModule):
    """A DataModule (see there) of `(image, label)` samples with `num_classes` classes: a subclass implements
    `load_datasets` and may check its labels with `_check_labels`."""

    task = "classification"

    def __init__(
        self,
        num_classes: int,
        input_shape: Sequence[int],
        split: Sequence[int | float] | None = None,
        split_seed: int = 42,
        augment: bool = True,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            input_shape=input_shape,
            split=split,
            split_seed=split_seed,
            augment=augment,
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            drop_last=drop_last,
        )

    def _check_labels(self, labels: torch.Tensor) -> None:
        found = int(labels.max()) + 1
        if found != self.hparams.num_classes:
            raise ValueError(
                f"data.num_classes={self.hparams.num_classes} but {self.name} has {found} classes; "
                f"fix data.num_classes in the data config"
            )
