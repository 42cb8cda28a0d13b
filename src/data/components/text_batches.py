"""How token-id samples become batches: padded to each batch's own longest sample (dynamic padding), and,
with `data.group_by_length`, batches of samples of similar lengths that still resume mid-epoch exactly."""

from collections.abc import Iterator, Sequence
from itertools import islice

import torch
from torch import Tensor
from torch.utils.data import BatchSampler, Sampler

from src.data.components.resumable import ResumableBatchSampler

WINDOW = 50  # length-grouped batches are sorted within windows of this many batches of the shuffled order


class PadCollate:
    """`(ids, label)` samples -> `({"input_ids": (B, L), "attention_mask": (B, L)}, labels (B,))`, L the
    longest sample of the batch, padded on the right with `pad_token_id`. A class, not a closure, so that
    DataLoader worker processes can receive it."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, batch: list[tuple[Tensor, int]]) -> tuple[dict[str, Tensor], Tensor]:
        samples, labels = zip(*batch, strict=True)
        longest = max(len(ids) for ids in samples)
        input_ids = torch.full((len(samples), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(samples), longest), dtype=torch.long)
        for row, ids in enumerate(samples):
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}, torch.tensor(
            labels, dtype=torch.long
        )


class LengthGroupedBatchSampler(ResumableBatchSampler):
    """Batches of samples of similar lengths, so that little of each batch is padding: the sampler's order
    is cut into windows of `WINDOW` batches, each window sorted by `lengths` (token counts by sample index)
    and cut into batches. The batches depend only on the sampler's order (seed and epoch), so a resumed run
    skips the very batches it had (ResumableBatchSampler's skip). Within a window batches run from the
    longest to the shortest. Lightning rebuilds it under DDP from these arguments, around its distributed
    sampler: keep the signature."""

    def __init__(
        self, sampler: Sampler[int], batch_size: int, drop_last: bool, lengths: Sequence[int]
    ) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = lengths

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0
        yield from islice(self.grouped(), skip, None)

    def grouped(self) -> Iterator[list[int]]:
        """The batches of one pass over the sampler, none skipped."""
        order, size = list(self.sampler), self.batch_size
        for start in range(0, len(order), WINDOW * size):
            window = sorted(order[start : start + WINDOW * size], key=lambda i: -self.lengths[i])
            for batch in (window[i : i + size] for i in range(0, len(window), size)):
                if len(batch) == size or not self.drop_last:
                    yield batch


def epoch_batches(batch_sampler: BatchSampler) -> list[list[int]]:
    """The batches of the batch sampler's next pass, without touching its resume state."""
    if isinstance(batch_sampler, LengthGroupedBatchSampler):
        return list(batch_sampler.grouped())
    return list(BatchSampler(batch_sampler.sampler, batch_sampler.batch_size, batch_sampler.drop_last))


def padding_saved(lengths: Sequence[int], batches: list[list[int]], max_length: int) -> tuple[int, int]:
    """The token positions of these batches padded to each batch's longest sample, and padded to max_length."""
    dynamic = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    return dynamic, sum(len(batch) for batch in batches) * max_length
