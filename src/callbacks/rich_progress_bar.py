"""Lightning's rich progress bar, drawing training batches at most `refresh_rate` times a second
(configs/callbacks/rich_progress_bar.yaml)."""

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar as LightningRichProgressBar

from src.compat.lightning import wake_refresh_thread


class RichProgressBar(LightningRichProgressBar):
    """Lightning's RichProgressBar (same arguments), drawing only on its refresh thread, at most
    `refresh_rate` times a second.

    Lightning 2.6 updates the bar and reads every progress-bar metric back to the host (`.item()`) after
    each training batch: a GPU sync per step, and a fixed cost that shows on small models. Here a training
    batch that ends less than 1/`refresh_rate` seconds after the last drawn one is not drawn; the last batch of
    an epoch always is. And rich redraws the whole display on the training thread whenever a bar is added or
    reset (each epoch's training bar, each validation's bar): those redraws are left to the refresh thread too.
    Lightning's refresh thread sleeps between redraws, and stopping the bar (at the end of fit, and of test)
    waits for its sleep to end: up to 1/`refresh_rate` seconds each time. This bar's thread wakes at once.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._drawn_at = float("-inf")

    def _draw_on_the_refresh_thread(self) -> None:
        """Called after each hook that may have started the display."""
        if self.is_enabled and self.progress is not None:
            self.progress.refresh = self.progress.soft_refresh  # what rich calls after add_task and reset
            wake_refresh_thread(self.progress)

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_sanity_check_start(trainer, pl_module)
        self._draw_on_the_refresh_thread()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._draw_on_the_refresh_thread()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_start(trainer, pl_module)
        self._draw_on_the_refresh_thread()

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_test_start(trainer, pl_module)
        self._draw_on_the_refresh_thread()

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_predict_start(trainer, pl_module)
        self._draw_on_the_refresh_thread()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)  # draws the new epoch's bar
        self._draw_on_the_refresh_thread()
        self._drawn_at = time.monotonic()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.monotonic()
        last = batch_idx + 1 == self.total_train_batches
        if self.is_enabled and not last and now - self._drawn_at < 1 / self.refresh_rate:
            return
        self._drawn_at = now
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
