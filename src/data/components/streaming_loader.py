"""litdata's StreamingDataLoader, shuffling each epoch by the Trainer's epoch (imported with litdata, when a
loader of shards is built)."""

from collections.abc import Callable, Iterator
from typing import Any

from src.data.components.shards import litdata


class StreamingLoader(litdata().StreamingDataLoader):
    """litdata's loader, whose pass over the data is that of the Trainer's epoch (`epoch()`; None: its own
    count, as outside a Trainer).

    litdata counts epochs itself: one more at each pass, except after `load_state_dict`, whose pass continues
    the saved epoch. It takes that pass as over only when it was read to its very end, which Lightning does
    not do (it stops after the loader's length): a run resumed mid-epoch then read the next epoch in the order
    of the one it resumed, and ended with other weights than the run that never stopped.
    """

    def __init__(self, *args: Any, epoch: Callable[[], int | None] = lambda: None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        epoch = self.epoch()
        # litdata counts from 1: the saved position belongs to this pass when it is of epoch + 1.
        if epoch is not None and not (self.restore and self.current_epoch == epoch + 1):
            self.restore = False  # a new pass: not the saved position, whatever litdata still holds
            self.current_epoch = epoch  # litdata's pass adds one
        return super().__iter__()
