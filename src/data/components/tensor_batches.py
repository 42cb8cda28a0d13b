"""Datasets held as tensors, served a whole batch at a time (in_memory_datamodule.py and those built on it)."""

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset, TensorDataset


class TensorBatches(TensorDataset):
    """A TensorDataset that serves whole batches: the DataLoader hands `__getitems__` a batch's indices, and
    each tensor is indexed once, instead of `batch_size` calls to `__getitem__` and a collate."""

    def __init__(self, *tensors: Tensor, device: torch.device | None = None) -> None:
        super().__init__(*(t.to(device) if device is not None else t for t in tensors))

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        index = torch.as_tensor(indices, device=self.tensors[0].device)
        return [tensor[index] for tensor in self.tensors]


def keep_batch(batch: list[Tensor]) -> list[Tensor]:
    """The collate of TensorBatches: its batches are made already. (A function, so worker processes can
    pickle it.)"""
    return batch


def tensors_of(dataset: Dataset) -> tuple[Tensor, ...]:
    """The rows of a TensorDataset, or of a Subset of one, in the dataset's order, as contiguous tensors."""
    if isinstance(dataset, Subset):
        index = torch.as_tensor(dataset.indices)
        return tuple(tensor[index] for tensor in tensors_of(dataset.dataset))
    if isinstance(dataset, TensorDataset):
        return dataset.tensors
    raise TypeError(
        f"data.loading=batches needs tensor datasets, but this split is a {type(dataset).__name__}; "
        "use data.loading=samples"
    )
