"""Base of the classification datamodules: (image, class index) samples, the class count checked against the
labels, and k-fold cross-validation stratified by class."""

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from src.data.datamodule import DataModule


class ClassificationDataModule(DataModule):
    """A DataModule (see there) of `(image, label)` samples with `num_classes` classes: a subclass implements
    `load_datasets` and may check its labels with `_check_labels`. Its folds (`num_folds`) are stratified:
    each holds every class in the proportions of the train+val pool."""

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

    def fold_labels(self, dataset: Dataset) -> list[int]:
        """The label of every sample of `dataset`, read without loading images where the dataset keeps its
        labels apart: a TensorDataset's second tensor, a `targets` list (torchvision's name; ImageDataset
        has one), else each sample's second item."""
        if isinstance(dataset, Subset):
            labels = self.fold_labels(dataset.dataset)
            return [labels[i] for i in dataset.indices]
        if isinstance(dataset, TensorDataset):
            return dataset.tensors[1].tolist()
        if hasattr(dataset, "targets"):
            return [int(label) for label in dataset.targets]
        return [int(dataset[i][1]) for i in range(len(dataset))]
