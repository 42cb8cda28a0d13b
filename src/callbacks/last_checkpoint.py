"""The latest training state, always at hand: what a named run resumes from after a crash."""

import time
from pathlib import Path

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn


class LastCheckpoint(L.Callback):
    """Keeps `<dirpath>/<filename>.ckpt` the latest full training state: at the end of every epoch (after its
    validation) and, if `every_n_train_steps` is set, every N optimizer steps.

    Epochs that end less than `min_seconds_between` after the previous save are not saved, but for the last
    one: a run of many short epochs does not spend its time writing checkpoints (and a crash costs at most
    that many seconds, or one epoch).

    Lightning's `ModelCheckpoint(save_last=True)` writes last.ckpt only when its monitored metric improved,
    and cannot combine step and epoch triggers; a resume needs the latest state, every time.
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

    def idle_batch_hooks(self, trainer: L.Trainer) -> list[str]:
        """Without step saves, Lightning need not call the batch hook (src/run/builder.py)."""
        return [] if self.every_n_train_steps else ["on_train_batch_end"]

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if self.every_n_train_steps and trainer.global_step % self.every_n_train_steps == 0:
            self._save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Runs after the epoch's validation, so the state includes its results.
        if time.monotonic() - self._saved_at >= self.min_seconds_between or _last_epoch(trainer):
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
