"""Base for datasets small enough to hold in memory as tensors (MNIST, digits): normalised once, shifted on the
device, and served a whole batch at a time."""

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset, Subset, TensorDataset

from src.data.classification_datamodule import ClassificationDataModule
from src.data.components.images import standard_transform  # [part: predict]
from src.data.datamodule import seeded_split


class TensorBatches(TensorDataset):
    """A TensorDataset that serves whole batches: the DataLoader hands `__getitems__` a batch's indices, and
    each tensor is indexed once, instead of `batch_size` calls to `__getitem__` and a collate. Its loaders
    take `collate_fn=list`: the batch is made already."""

    def __init__(self, *tensors: Tensor, device: torch.device | None = None) -> None:
        super().__init__(*(tensor.to(device) for tensor in tensors))

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        index = torch.as_tensor(indices, device=self.tensors[0].device)
        return [tensor[index] for tensor in self.tensors]


def tensors_of(dataset: Dataset) -> tuple[Tensor, ...]:
    """The rows of a TensorDataset, or of a Subset of one, in the dataset's order, as contiguous tensors."""
    if isinstance(dataset, Subset):
        return tuple(tensor[dataset.indices] for tensor in tensors_of(dataset.dataset))
    if isinstance(dataset, TensorDataset):
        return dataset.tensors
    raise TypeError(
        f"data.loading=batches needs tensor datasets, but this split is a {type(dataset).__name__}; "
        "use data.loading=samples"
    )


def normalized_dataset(images: Tensor, labels: Tensor, mean: float, std: float) -> TensorDataset:
    """Images scaled to [0, 1] as float32 (N, C, H, W), then standardised with the dataset's mean and std."""
    return TensorDataset((images.float() - mean) / std, labels.long())


class InMemoryDataModule(ClassificationDataModule):
    """Image tensors in memory: subclasses implement `load_datasets` (see ClassificationDataModule).

    Every argument is documented in configs/data/mnist5k.yaml. `split` gives the sizes (or fractions) of the
    splits that `load_datasets` draws with `split_seed`; `mean`/`std` standardise pixels scaled to [0, 1]
    (`split_images` does both). `loading` says how batches are made from the tensors (same samples, same
    order, whichever is chosen): `samples` one sample at a time and a collate, as a custom Dataset would;
    `batches` (the default) a whole batch with one indexing operation per tensor (TensorBatches); `device`
    the same, from tensors moved once to the accelerator (a GPU), so no batch is copied from the host.
    """

    def __init__(
        self,
        data_dir: str,
        num_classes: int,
        input_shape: Sequence[int],
        split: Sequence[int | float],
        mean: float = 0.0,
        std: float = 1.0,
        random_shift: int = 0,
        loading: str = "batches",
        **settings: Any,
    ) -> None:
        """`settings`: the DataModule's (split_seed, folds, augment, batch_size, num_workers, ...; see there)."""
        super().__init__(num_classes=num_classes, input_shape=input_shape, split=split, **settings)
        if loading not in ("samples", "batches", "device"):
            raise ValueError(f"data.loading={loading} is not one of samples, batches, device")
        if loading == "device" and (self.hparams.num_workers > 0 or self.hparams.pin_memory):
            raise ValueError(
                "data.loading=device serves batches from the accelerator's memory: it needs data.num_workers=0 "
                f"and data.pin_memory=false (got {self.hparams.num_workers} and {self.hparams.pin_memory})"
            )
        # TensorBatches' batches are made already; a builtin, so that worker processes can pickle it.
        self.collate_fn = list if loading != "samples" else None

    def setup(self, stage: str | None = None) -> None:
        fresh = self.data_train is None
        super().setup(stage)
        if fresh and self.hparams.loading != "samples":
            on_device = self.hparams.loading == "device" and self.trainer is not None
            device = self.trainer.strategy.root_device if on_device else None
            self.data_train, self.data_val, self.data_test = (
                TensorBatches(*tensors_of(split), device=device)
                for split in (self.data_train, self.data_val, self.data_test)
            )

    def split_images(self, images: Tensor, labels: Tensor) -> tuple[Dataset, ...]:
        """The train/val/test splits (`split`, drawn with `split_seed`) of `images` scaled to [0, 1], standardised
        with `mean`/`std`, once `labels` are checked against `num_classes`."""
        self._check_labels(labels)
        dataset = normalized_dataset(images, labels, self.hparams.mean, self.hparams.std)
        return tuple(seeded_split(dataset, self.hparams.split, self.hparams.split_seed, self.name))

    def on_after_batch_transfer(self, batch: list[Tensor], dataloader_idx: int) -> list[Tensor]:
        """Augment training batches on the device: shift each batch by up to `random_shift` pixels (unless
        `augment` is off)."""
        shift = self.hparams.random_shift if self.hparams.augment else 0
        if shift and self.trainer is not None and self.trainer.training:
            images, labels = batch
            height, width = images.shape[-2:]
            padded = F.pad(images, (shift, shift, shift, shift), mode="replicate")
            top, left = torch.randint(0, 2 * shift + 1, (2,)).tolist()
            batch = [padded[..., top : top + height, left : left + width], labels]
        return batch

    # part: predict
    def inference_preprocessing(self) -> dict[str, Any]:
        """An image file becomes what training saw: grayscale (or RGB), resized to input_shape, scaled to
        [0, 1] and standardised with `mean`/`std` (what `normalized_dataset` does: override it for other
        tensors)."""
        channels, height, width = self.hparams.input_shape
        mean, std = [self.hparams.mean] * channels, [self.hparams.std] * channels
        return {
            "image_mode": "L" if channels == 1 else "RGB",
            "input_shape": [channels, height, width],
            "transform": standard_transform([height, width], mean, std),
        }

    # /part
