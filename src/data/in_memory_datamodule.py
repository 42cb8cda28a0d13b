"""Shared base for datasets small enough to hold in memory as tensors (MNIST, digits)."""

from collections.abc import Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset, random_split


def split_batch_size(batch_size: int, world_size: int) -> int:
    """Split a global batch size evenly across devices, so results do not depend on the device count."""
    if batch_size <= 0:
        raise ValueError(f"data.batch_size={batch_size} must be a positive integer")
    if batch_size % world_size:
        raise ValueError(
            f"data.batch_size={batch_size} is not divisible by {world_size} devices; "
            f"choose a multiple of {world_size} (it is the global batch, split across devices)"
        )
    return batch_size // world_size


def seeded_split(dataset: Dataset, lengths: Sequence[int | float], seed: int, name: str) -> list[Subset]:
    """Split `dataset` by sizes or fractions, the same way on every run and every rank."""
    total = len(dataset)
    is_fractions = all(isinstance(n, float) for n in lengths)
    if (is_fractions and abs(sum(lengths) - 1.0) > 1e-6) or (not is_fractions and sum(lengths) != total):
        raise ValueError(
            f"data.split={list(lengths)} does not fit {name}, which has {total} samples; "
            f"give integer sizes that sum to {total} or fractions that sum to 1.0"
        )
    return random_split(dataset, list(lengths), generator=torch.Generator().manual_seed(seed))


class InMemoryDataModule(L.LightningDataModule):
    """Base LightningDataModule over image tensors: subclasses implement `load_datasets`.

    Every argument is documented in configs/data/mnist5k.yaml. `split` gives the sizes (or fractions) of the
    splits that `load_datasets` draws with `split_seed`; `mean`/`std` standardise pixels scaled to [0, 1].
    `batch_size` is the global batch size; each of the `world_size` processes loads `batch_size / world_size`.
    """

    name: str = "dataset"

    def __init__(
        self,
        data_dir: str,
        num_classes: int,
        input_shape: Sequence[int],
        split: Sequence[int | float],
        split_seed: int = 42,
        mean: float = 0.0,
        std: float = 1.0,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        random_shift: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.data_train: Dataset | None = None
        self.data_val: Dataset | None = None
        self.data_test: Dataset | None = None
        self.batch_size_per_device = batch_size

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        """Return the (train, val, test) datasets of normalised float images and int64 labels."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        world_size = self.trainer.world_size if self.trainer is not None else 1
        self.batch_size_per_device = split_batch_size(self.hparams.batch_size, world_size)
        if self.data_train is None:
            self.data_train, self.data_val, self.data_test = self.load_datasets()
            self._check_shapes(self.data_train)

    def _check_shapes(self, dataset: Dataset) -> None:
        image, _ = dataset[0]
        if list(image.shape) != list(self.hparams.input_shape):
            raise ValueError(
                f"data.input_shape={list(self.hparams.input_shape)} but {self.name} images have shape "
                f"{list(image.shape)}; fix data.input_shape in the data config"
            )

    def _check_labels(self, labels: torch.Tensor) -> None:
        found = int(labels.max()) + 1
        if found != self.hparams.num_classes:
            raise ValueError(
                f"data.num_classes={self.hparams.num_classes} but {self.name} has {found} classes; "
                f"fix data.num_classes in the data config"
            )

    def _loader(self, dataset: Dataset | None, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before asking for a DataLoader")
        workers = self.hparams.num_workers
        return DataLoader(
            dataset,
            batch_size=self.batch_size_per_device,
            shuffle=shuffle,
            num_workers=workers,
            pin_memory=self.hparams.pin_memory,
            # DataLoader refuses persistent workers without workers: only ask for them when there are some.
            persistent_workers=self.hparams.persistent_workers and workers > 0,
        )

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

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.data_train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.data_val, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.data_test, shuffle=False)


def normalized_dataset(images: torch.Tensor, labels: torch.Tensor, mean: float, std: float) -> TensorDataset:
    """Images scaled to [0, 1] as float32 (N, C, H, W), then standardised with the dataset's mean and std."""
    return TensorDataset((images.float() - mean) / std, labels.long())
