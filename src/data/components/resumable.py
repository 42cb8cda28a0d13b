"""A training DataLoader that resumes in the middle of an epoch exactly where the checkpoint left it.

Lightning saves the `state_dict()` of every train DataLoader that has one in its checkpoints and gives it
back through `load_state_dict()` before iterating again. Here that state is the number of batches already
delivered in the current epoch and the shuffling seed; the order of an epoch depends only on
(seed, epoch) (Lightning calls `set_epoch`), so skipping those batches in the batch sampler, without
loading them, continues the same order. Under DDP Lightning wraps the sampler in a distributed one and
rebuilds this batch sampler around it, so the skip applies to each rank's own share.
"""

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler


class EpochShuffleSampler(Sampler[int]):
    """A random order of `length` indices that depends only on `seed` and the epoch set by `set_epoch`."""

    def __init__(self, length: int, seed: int) -> None:
        self.length = length
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.length, generator=generator).tolist()

    def __len__(self) -> int:
        return self.length


class ResumableBatchSampler(BatchSampler):
    """PyTorch's BatchSampler that can skip the first batches of its next pass, once."""

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.skip = 0

    def __iter__(self) -> Iterator[list[int]]:
        batches, skip, self.skip = super().__iter__(), self.skip, 0
        for _ in range(skip):
            next(batches, None)
        yield from batches


class ResumableDataLoader(DataLoader):
    """A DataLoader (same arguments) whose state is the batches delivered this epoch, for Lightning's checkpoints.

    Build it with `batch_sampler=ResumableBatchSampler(...)`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._delivered = 0

    def __iter__(self) -> Iterator[Any]:
        self._delivered = self.batch_sampler.skip  # a resumed pass starts after the skipped batches
        for batch in super().__iter__():
            self._delivered += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"batches": self._delivered, "seed": getattr(self.batch_sampler.sampler, "seed", 0)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["batches"] < len(self.batch_sampler):  # a checkpoint from the end of an epoch skips nothing
            self.batch_sampler.skip = state["batches"]
        # Under DDP the sampler is Lightning's distributed wrapper around ours, which the run seeds alike again.
        if isinstance(self.batch_sampler.sampler, EpochShuffleSampler):
            self.batch_sampler.sampler.seed = state["seed"]
