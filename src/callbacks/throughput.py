"""Training throughput in samples per second, measured without the warm-up (torch.compile's first steps)."""

import time

import lightning as L


class Throughput(L.Callback):
    """Logs two figures at the end of every training epoch, both leaving out the first `warmup_steps` steps
    of the run, where torch.compile compiles and CUDA warms up (a compiled run is not charged its compile):

    - `perf/train_samples_per_sec`: this epoch's training batches only, data loading included, timed from the
      end of one batch to the end of the next; validation and checkpointing are not counted.
    - `perf/fit_samples_per_sec`: every training sample since the warm-up over all the wall time since then,
      validation, checkpoints and logging included: what a run really gets.

    Both count the samples of all ranks together. Timing reads only the host clock: no device sync.
    """

    def __init__(self, warmup_steps: int = 1) -> None:
        if warmup_steps < 0:
            raise ValueError(f"callbacks.throughput.warmup_steps={warmup_steps} must be 0 or more")
        self.warmup_steps = warmup_steps

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._steps_seen, self._fit_samples, self._fit_start = 0, 0, time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._samples, self._seconds, self._last = 0, 0.0, time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        now = time.perf_counter()
        self._steps_seen += 1
        if self._steps_seen <= self.warmup_steps:
            self._fit_start = now  # the fit's time starts when the warm-up ends
        else:
            self._samples += len(batch[0])
            self._seconds += now - self._last
            self._fit_samples += len(batch[0])
        self._last = now

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last = time.perf_counter()  # a validation inside the epoch is not training time

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        world = trainer.world_size  # every rank trains its share
        if self._seconds > 0:
            rate = self._samples * world / self._seconds
            pl_module.log("perf/train_samples_per_sec", rate, rank_zero_only=True)
        if self._fit_samples:
            rate = self._fit_samples * world / (time.perf_counter() - self._fit_start)
            pl_module.log("perf/fit_samples_per_sec", rate, rank_zero_only=True)
