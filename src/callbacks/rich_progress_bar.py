"""Lightning's rich progress bar, drawing training batches at most `refresh_rate` times a second, and one log
line per epoch where there is no terminal to draw on (configs/callbacks/rich_progress_bar.yaml)."""

import logging
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar as LightningRichProgressBar
from rich.console import Console

from src.compat.lightning import wake_refresh_thread

log = logging.getLogger(__name__)


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

    Where the output is no terminal (a log file, a SLURM job's output) rich would draw nothing until the end:
    there the bar logs one line per training epoch instead (its number, steps, seconds, and `monitor`).
    """

    def __init__(self, *args: Any, monitor: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.monitor = monitor
        console = Console(**(kwargs.get("console_kwargs") or {}))
        self.draws = console.is_terminal or console.is_jupyter  # else: a line per epoch
        self._drawn_at = float("-inf")
        self._epoch_started_at, self._epoch_first_step = 0.0, 0

    @property
    def is_enabled(self) -> bool:
        return self.draws and super().is_enabled  # whatever enables it again (Lightning's LR finder does)

    def idle_batch_hooks(self, trainer: L.Trainer) -> list[str]:
        """A bar that draws nothing need not be called at every batch (src/run/builder.py)."""
        if self.draws:
            return []
        stages = ("train", "validation", "test", "predict")
        return [f"on_{stage}_batch_{when}" for stage in stages for when in ("start", "end")]

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
        self._drawn_at = self._epoch_started_at = time.monotonic()
        self._epoch_first_step = trainer.global_step

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if not self.draws and trainer.is_global_zero and not trainer.sanity_checking:
            log.info(self.epoch_line(trainer, time.monotonic() - self._epoch_started_at))

    def epoch_line(self, trainer: L.Trainer, seconds: float) -> str:
        """`Epoch 3/14: 469 steps in 12.3 s, val/acc=0.9712`: the epoch numbered as the bar, the checkpoints and
        metrics.csv number it (from 0), the optimizer steps this process took in it (fewer in an epoch resumed
        in the middle), and the monitored metric's latest value (this epoch's, when it validated)."""
        last = f"/{trainer.max_epochs - 1}" if trainer.max_epochs not in (None, -1) else ""
        steps = trainer.global_step - self._epoch_first_step
        line = f"Epoch {trainer.current_epoch}{last}: {steps} steps in {seconds:.1f} s"
        value = trainer.callback_metrics.get(self.monitor) if self.monitor else None
        return line if value is None else f"{line}, {self.monitor}={float(value):.4f}"

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.monotonic()
        last = batch_idx + 1 == self.total_train_batches
        if self.is_enabled and not last and now - self._drawn_at < 1 / self.refresh_rate:
            return
        self._drawn_at = now
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
