"""Lightning's rich progress bar, drawing training batches at most `refresh_rate` times a second
(configs/callbacks/rich_progress_bar.yaml)."""

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar as LightningRichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import _RefreshThread


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

    def _init_progress(self, trainer: L.Trainer) -> None:
        super()._init_progress(trainer)
        if self.is_enabled and self.progress is not None:
            self.progress.refresh = self.progress.soft_refresh  # what rich calls after add_task and reset
            live = self.progress.live
            if isinstance(live._refresh_thread, _RefreshThread) and not isinstance(
                live._refresh_thread, _WakingRefreshThread
            ):
                live._refresh_thread.stop()  # ends after its current sleep, unjoined (a daemon thread)
                live._refresh_thread = _WakingRefreshThread(live, live.refresh_per_second)
                live._refresh_thread.start()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)  # draws the new epoch's bar
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


class _WakingRefreshThread(_RefreshThread):
    """Lightning's refresh thread, waiting on its stop event instead of sleeping, so stopping it is immediate."""

    def run(self) -> None:
        while not self.done.wait(1 / self.refresh_per_second):
            if self.refresh_cond:
                with self.live._lock:
                    self.live.refresh()
                self.refresh_cond = False
