"""What the datamodule of every task shares: splits, k-fold cross-validation, the per-device batch size,
resumable shuffling and the DataLoader settings. Classification and segmentation add their own checks on top
(classification_datamodule.py, segmentation_datamodule.py)."""

import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset, random_split

from src.data.components.resumable import EpochShuffleSampler, ResumableBatchSampler, ResumableDataLoader

log = logging.getLogger(__name__)


def split_batch_size(batch_size: int, world_size: int) -> int:
    """Split a global batch size evenly across devices, so results do not depend on the device count. (Preflight
    has refused a batch size below 1.)"""
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


def assign_parts(sizes: Sequence[int], seed: int, labels: Sequence[int] | None = None) -> torch.Tensor:
    """Each sample's part (0..len(sizes)-1), `sizes[i]` samples in part i, the same on every run and rank: the
    samples, shuffled by `seed` and then grouped by label when `labels` are given, are dealt to the parts in
    turn like cards, each part as often as its size says. So every class is spread over the parts in their
    proportions (a split or a fold misses a class only when that class has too few samples to share)."""
    order = torch.randperm(sum(sizes), generator=torch.Generator().manual_seed(seed))
    if labels is not None:
        order = order[torch.sort(torch.as_tensor(labels)[order], stable=True).indices]
    # Part i's k-th card is due at (k + 0.5) / sizes[i] of the deck; ties go to the lower part, so equal
    # sizes deal 0, 1, ..., 0, 1, ... in turn.
    due = torch.cat([(torch.arange(n) + 0.5) / n for n in sizes])
    parts = torch.repeat_interleave(torch.arange(len(sizes)), torch.as_tensor(sizes))
    assigned = torch.empty(len(order), dtype=torch.long)
    assigned[order] = parts[torch.sort(due, stable=True).indices]
    return assigned


class DataModule(L.LightningDataModule):
    """Base LightningDataModule for (input, target) datasets: a subclass implements `load_datasets`, nothing else.

    `batch_size` is the global batch size; each of the world's processes loads `batch_size / world_size`.
    The DataLoader settings are documented in configs/data/mnist5k.yaml. `drop_last` applies to the
    training loader only: validation and test always see every sample. `split` and `split_seed` are for
    subclasses that draw their splits from one pool (`seeded_split`). `augment=False` asks for training
    samples without random augmentation (`debug=overfit` sets it): a subclass that augments honours it.

    k-fold cross-validation (`num_folds=k`): the train and val datasets of `load_datasets` are pooled, the pool
    is cut into k folds by `split_seed` alone (`assign_parts`: the same folds on every run, rank and resume;
    fold sizes differ by at most one), and the run trains on the other folds and validates on fold `fold`;
    the test split stays as it is. Each fold holds every class in the pool's proportions when `fold_labels`
    gives the labels (classification does). Validation samples must not get the training augmentation, so
    `fold_pool` gives the pool twice: prepared as training samples (for the training folds) and as validation
    samples (for the validation fold). A subclass whose train and val datasets are prepared differently (other
    transforms) overrides it; the default refuses any datasets it cannot prove to be prepared alike.
    """

    @property
    def name(self) -> str:
        """What error messages call the dataset: the class name, unless a subclass sets `name`."""
        return type(self).__name__

    def __init__(
        self,
        input_shape: Sequence[int],
        split: Sequence[int | float] | None = None,
        split_seed: int = 42,
        num_folds: int | None = None,
        fold: int = 0,
        augment: bool = True,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        if num_workers < 0:
            raise ValueError(f"data.num_workers={num_workers} must be 0 (load in the main process) or more")
        if prefetch_factor is not None and prefetch_factor < 1:
            raise ValueError(f"data.prefetch_factor={prefetch_factor} must be at least 1 (or null)")
        if num_folds is not None and num_folds < 2:
            raise ValueError(f"data.num_folds={num_folds} must be null (no folds) or at least 2")
        if num_folds is None and fold != 0:
            raise ValueError(
                f"data.fold={fold} needs folds: set data.num_folds (e.g. 5) for k-fold cross-validation, or "
                "leave data.fold=0"
            )
        if num_folds is not None and not 0 <= fold < num_folds:
            raise ValueError(
                f"data.fold={fold} is not a fold of data.num_folds={num_folds}; choose 0..{num_folds - 1}"
            )
        # Every __init__ argument of the subclass too (Lightning collects them): stored in checkpoints.
        self.save_hyperparameters(logger=False)
        self.data_train = self.data_val = self.data_test = None  # the datasets, once set up
        self.batch_size_per_device = batch_size
        self.collate_fn: Callable[[list[Any]], Any] | None = None  # None: PyTorch's default collate

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        """Return the (train, val, test) datasets of (float tensor of shape input_shape, target) samples."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_datasets()")

    @classmethod
    def complete_config(cls, cfg: DictConfig) -> None:
        """Fill in the keys of the run's config that follow from this data and were left null (its classes as
        its files name them, or another group's key, such as a tokenizer it ships for a net that has none),
        before anything is built: the run record and a named run's resume check see the filled values.
        Nothing here. Every task calls it (`src.run.builder.complete_config`); any LightningDataModule may
        define it."""

    def setup(self, stage: str | None = None) -> None:
        world_size = self.trainer.world_size if self.trainer is not None else 1
        self.batch_size_per_device = split_batch_size(self.hparams.batch_size, world_size)
        if self.data_train is not None:
            return
        self.data_train, self.data_val, self.data_test = self.load_datasets()
        if self.hparams.num_folds is not None:
            self.data_train, self.data_val = self._fold(self.data_train, self.data_val)
        for split in ("train", "val", "test"):
            if len(getattr(self, f"data_{split}")) == 0:
                raise ValueError(f"the {split} split of {self.name} is empty; check data.split and its files")
        self._check_shapes(self.data_train)

    def _check_shapes(self, dataset: Dataset) -> None:
        shape, expected = list(dataset[0][0].shape), list(self.hparams.input_shape)
        if shape != expected:
            raise ValueError(
                f"data.input_shape={expected} but {self.name} images have shape {shape}; "
                "fix data.input_shape in the data config"
            )

    def fold_pool(self, train: Dataset, val: Dataset) -> tuple[Dataset, Dataset]:
        """The train then the val samples as one pool, twice: prepared for training (the training folds are
        drawn from it) and for validation (the validation fold is). Here both are one dataset, for train and
        val datasets that are Subsets of one dataset (`seeded_split`) or tensors of one class: nothing prepares
        their samples differently (InMemoryDataModule augments training batches, not its datasets)."""
        if isinstance(train, Subset) and isinstance(val, Subset) and train.dataset is val.dataset:
            pool = Subset(train.dataset, [*train.indices, *val.indices])
            return pool, pool
        if isinstance(train, TensorDataset) and type(train) is type(val):
            pool = type(train)(*(torch.cat(pair) for pair in zip(train.tensors, val.tensors, strict=True)))
            return pool, pool
        raise NotImplementedError(
            f"data.num_folds={self.hparams.num_folds}: {self.name}'s train and val datasets are "
            f"{type(train).__name__} and {type(val).__name__}, which may prepare samples differently "
            f"(augment the training ones); override {type(self).__name__}.fold_pool (see DataModule.fold_pool)"
        )

    def fold_labels(self, dataset: Dataset) -> Sequence[int] | None:
        """The class of every sample of `dataset`, to stratify the folds by; None: folds unstratified (every
        task but classification)."""
        return None

    def _fold(self, train: Dataset, val: Dataset) -> tuple[Subset, Subset]:
        """The training folds and the validation fold `fold` of the train+val pool."""
        num_folds = self.hparams.num_folds
        train_pool, val_pool = self.fold_pool(train, val)
        size = len(val_pool)
        if size < num_folds:
            raise ValueError(
                f"data.num_folds={num_folds} is more than the {size} train+val samples of {self.name}; "
                f"choose 2..{size}"
            )
        labels = self.fold_labels(val_pool)
        # Not an error: such a class still trains and validates, only not in every fold.
        if rare := {label: n for label, n in sorted(Counter(labels or []).items()) if n < num_folds}:
            log.warning(
                f"data.num_folds={num_folds}: {self.name} has fewer samples than folds of class(es) {rare} "
                "(class: samples), so some validation folds miss them"
            )
        sizes = [len(range(fold, size, num_folds)) for fold in range(num_folds)]
        in_fold = assign_parts(sizes, self.hparams.split_seed, labels) == self.hparams.fold
        train_indices, val_indices = (torch.where(chosen)[0].tolist() for chosen in (~in_fold, in_fold))
        return Subset(train_pool, train_indices), Subset(val_pool, val_indices)

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before asking for a DataLoader")
        workers = self.hparams.num_workers
        settings = {
            "collate_fn": self.collate_fn,
            "num_workers": workers,
            "pin_memory": self.hparams.pin_memory,
            # DataLoader refuses both without worker processes: only pass them when there are some.
            "persistent_workers": self.hparams.persistent_workers and workers > 0,
            "prefetch_factor": self.hparams.prefetch_factor if workers > 0 else None,
        }
        if not train:
            return DataLoader(dataset, batch_size=self.batch_size_per_device, **settings)
        # Training: shuffled by (seed, epoch) and resumable mid-epoch (src/data/components/resumable.py).
        seed = self._shuffle_seed()
        sampler = EpochShuffleSampler(len(dataset), seed=seed)
        batch_sampler = ResumableBatchSampler(sampler, self.batch_size_per_device, self.hparams.drop_last)
        # A generator of its own: starting an epoch (worker seeds) then draws nothing from torch's global one,
        # which the model's dropout and augmentations use, so resuming does not shift their random numbers.
        generator = torch.Generator().manual_seed(seed)
        return ResumableDataLoader(dataset, batch_sampler=batch_sampler, generator=generator, **settings)

    def _shuffle_seed(self) -> int:
        """The run's seed (`seed_everything` exports it); unseeded, a random one, or 0 under DDP, where every
        rank must shuffle alike."""
        if "PL_GLOBAL_SEED" in os.environ or (self.trainer is not None and self.trainer.world_size > 1):
            return int(os.environ.get("PL_GLOBAL_SEED", 0))
        return int(torch.randint(0, 2**62, ()).item())

    # part: predict
    def inference_preprocessing(self) -> dict[str, Any]:
        """How predict and export turn one image file into the net's input; stored in the model's checkpoints
        (TaskModule.setup), so a checkpoint needs neither this class nor its data to predict.

        Keys: `image_mode` (PIL mode the file is converted to: "L", "RGB"), `input_shape` ([C, H, W]),
        `collate` (the dotted path of a collate function; null: PyTorch's default) and `transform` (a
        transforms-v2 config from a PIL image to the float tensor `load_datasets` gives; plain data). A
        subclass that reads image files returns what its test images go through (InMemoryDataModule's is an
        example).

        This default cannot know how a subclass made its tensors (scaled how, normalised with what, or not
        from images at all), and a guess would give wrong predictions without an error. So its `transform`
        is None: training, eval, and predict and export on the test split work; image files are refused,
        naming this class.
        """
        return {"input_shape": list(self.hparams.input_shape), "image_mode": None, "transform": None}

    # /part

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.data_train, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.data_val, train=False)

    def test_dataloader(self) -> DataLoader:
        """Also predict's, when it runs on the test split: predictions line up with `trainer.test`'s samples."""
        return self._loader(self.data_test, train=False)
