"""Base for datasets small enough to hold in memory as tensors (MNIST, digits): normalised once, shifted on the device."""

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from src.data.classification_datamodule import ClassificationDataModule


class InMemoryDataModule(ClassificationDataModule):
    """Image tensors in memory: subclasses implement `load_datasets` (see ClassificationDataModule).

    Every argument is documented in configs/data/mnist5k.yaml. `split` gives the sizes (or fractions) of the
    splits that `load_datasets` draws with `split_seed`; `mean`/`std` standardise pixels scaled to [0, 1].
    """

    def __init__(
        self,
        data_dir: str,
        num_classes: int,
        input_shape: Sequence[int],
        split: Sequence[int | float],
        split_seed: int = 42,
        mean: float = 0.0,
        std: float = 1.0,
        random_shift: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            num_classes=num_classes,
            input_shape=input_shape,
            split=split,
            split_seed=split_seed,
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            drop_last=drop_last,
        )

    def inference_preprocessing(self) -> dict[str, Any]:
        """An image file becomes what training saw: grayscale (or RGB), resized to input_shape, scaled to
        [0, 1] and standardised with `mean`/`std`."""
        channels, height, width = self.hparams.input_shape
        return {
            "image_mode": "L" if channels == 1 else "RGB",
            "input_shape": [channels, height, width],
            "collate": "stack",
            "transform": standard_transform(
                [height, width], [self.hparams.mean] * channels, [self.hparams.std] * channels
            ),
        }

    def on_after_batch_transfer(self, batch: list[torch.Tensor], dataloader_idx: int) -> list[torch.Tensor]:
        """Augment training batches on the device: shift each batch by up to `random_shift` pixels."""
        shift = self.hparams.random_shift
        if shift and self.trainer is not None and self.trainer.training:
            images, labels = batch
            height, width = images.shape[-2:]
            padded = F.pad(images, (shift, shift, shift, shift), mode="replicate")
            top, left = torch.randint(0, 2 * shift + 1, (2,)).tolist()
            batch = [padded[..., top : top + height, left : left + width], labels]
        return batch


def standard_transform(size: list[int], mean: list[float], std: list[float]) -> dict[str, Any]:
    """A transforms-v2 config: PIL image -> resized float tensor in [0, 1] -> standardised."""
    return {
        "_target_": "torchvision.transforms.v2.Compose",
        "transforms": [
            {"_target_": "torchvision.transforms.v2.ToImage"},
            {"_target_": "torchvision.transforms.v2.Resize", "size": list(size), "antialias": True},
            {
                "_target_": "torchvision.transforms.v2.ToDtype",
                "dtype": {"_target_": "hydra.utils.get_object", "path": "torch.float32"},
                "scale": True,
            },
            {"_target_": "torchvision.transforms.v2.Normalize", "mean": list(mean), "std": list(std)},
        ],
    }


def normalized_dataset(images: torch.Tensor, labels: torch.Tensor, mean: float, std: float) -> TensorDataset:
    """Images scaled to [0, 1] as float32 (N, C, H, W), then standardised with the dataset's mean and std."""
    return TensorDataset((images.float() - mean) / std, labels.long())
