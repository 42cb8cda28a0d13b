"""The latest training state, always at hand: what a named run resumes from after a crash."""

import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn


class LastCheckpoint(Checkpoint):
    """Keeps `<dirpath>/<filename>.ckpt` the latest full training state: at the end of every epoch (after its
    validation) and, if `every_n_train_steps` is set, every N optimizer steps.

    Epochs that end less than `min_seconds_between` after the previous save are not saved, but for the last
    one: a run of many short epochs does not spend its time writing checkpoints (and a crash costs at most
    that many seconds, or one epoch).

    Lightning's `ModelCheckpoint(save_last=True)` writes last.ckpt only when its monitored metric improved,
    and cannot combine step and epoch triggers; a resume needs the latest state, every time.

    A `Checkpoint`, so that Lightning calls it after the callbacks that are not and, among checkpoint
    callbacks, in the config's order (configs/callbacks/default.yaml: after model_checkpoint): a last.ckpt
    saved at the step or epoch end where a new best.ckpt was saved knows that best.ckpt, and a run resumed
    from it neither forgets it nor saves it again.
    """

    def __init__(
        self,
        dirpath: str,
        filename: str = "last",
        every_n_train_steps: int | None = None,
        min_seconds_between: float = 0.0,
    ) -> None:
        if every_n_train_steps is not None and every_n_train_steps < 1:
            raise ValueError(
                f"callbacks.last_checkpoint.every_n_train_steps={every_n_train_steps} must be >= 1 or null"
            )
        if min_seconds_between < 0:
            raise ValueError(
                f"callbacks.last_checkpoint.min_seconds_between={min_seconds_between} must be 0 or more"
            )
        self.path = Path(dirpath) / f"{filename}.ckpt"
        self.every_n_train_steps = every_n_train_steps
        self.min_seconds_between = min_seconds_between
        self._saved_step: int | None = None
        self._saved_at = float("-inf")
        self._step_due = False  # a step save that fell on an epoch's last batch waits for the epoch's end

    def idle_batch_hooks(self, trainer: L.Trainer) -> list[str]:
        """Without step saves, Lightning need not call the batch hook (src/run/builder.py)."""
        return [] if self.every_n_train_steps else ["on_train_batch_end"]

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (
            not self.every_n_train_steps
            or trainer.global_step % self.every_n_train_steps
            or not trainer.global_step
        ):
            return
        if batch_idx + 1 >= trainer.num_training_batches:
            # The epoch's last batch, before its validation: Lightning takes an epoch resumed from here as
            # done and skips that validation. The epoch-end save follows it.
            self._step_due = True
            return
        self._save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Runs after the epoch's validation, so the state includes its results.
        due, self._step_due = self._step_due, False
        if due or time.monotonic() - self._saved_at >= self.min_seconds_between or _last_epoch(trainer):
            self._save(trainer)

    def _save(self, trainer: L.Trainer) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run or trainer.state.fn != TrainerFn.FITTING:
            return
        if self._saved_step == trainer.global_step:
            return  # nothing new since the last save
        trainer.save_checkpoint(self.path, weights_only=False)  # atomic: src/run/checkpoints.py
        self._saved_step, self._saved_at = trainer.global_step, time.monotonic()


def _last_epoch(trainer: L.Trainer) -> bool:
    """Whether training stops after this epoch: early stopping, max_epochs or max_steps."""
    last_of_max = trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs
    out_of_steps = trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps
    return trainer.should_stop or last_of_max or out_of_steps
