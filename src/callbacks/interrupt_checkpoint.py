"""A checkpoint of the moment training was interrupted, so that the run can continue from there."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import OnExceptionCheckpoint


class InterruptCheckpoint(OnExceptionCheckpoint):
    """Lightning's OnExceptionCheckpoint (saves `<dirpath>/<filename>.ckpt` when training raises), except
    for a non-finite loss (`FloatingPointError` from the training guards), whose weights may already be
    broken. Lightning itself deletes the file when a later training run finishes normally."""

    def on_exception(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        exception = args[-1] if args else kwargs.get("exception")
        if isinstance(exception, FloatingPointError):
            return
        trainer.save_checkpoint(self.ckpt_path, weights_only=False)  # the full state, to resume from
