"""Training throughput in samples per second, measured without the warm-up (torch.compile's first steps)."""

import time

import lightning as L


class Throughput(L.Callback):
    """Logs `perf/train_samples_per_sec` at the end of every training epoch.

    It times the epoch's training batches, data loading included, from the end of one batch to the end of
    the next, and leaves out the first `warmup_steps` steps of the run, where torch.compile compiles and
    CUDA warms up, so a compiled run is not charged its compile time. Validation is not counted.
    """

    def __init__(self, warmup_steps: int = 1) -> None:
        if warmup_steps < 0:
            raise ValueError(f"callbacks.throughput.warmup_steps={warmup_steps} must be 0 or more")
        self.warmup_steps = warmup_steps
        self._samples, self._seconds, self._last = 0, 0.0, 0.0
        self._steps_seen = 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._samples, self._seconds, self._last = 0, 0.0, time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        now = time.perf_counter()
        self._steps_seen += 1
        if self._steps_seen > self.warmup_steps:
            self._samples += len(batch[0])
            self._seconds += now - self._last
        self._last = now

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last = time.perf_counter()  # a validation inside the epoch is not training time

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._seconds > 0:
            rate = self._samples * trainer.world_size / self._seconds  # every rank trains its share
            pl_module.log(
                "perf/train_samples_per_sec", rate, on_step=False, on_epoch=True, rank_zero_only=True
            )
