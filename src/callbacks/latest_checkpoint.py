"""The latest training state, always at hand: what a named run resumes from after a crash."""

from pathlib import Path

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn


class LatestCheckpoint(L.Callback):
    """Keeps `<dirpath>/<filename>.ckpt` the latest full training state: at the end of every epoch (after its
    validation) and, if `every_n_train_steps` is set, every N optimizer steps.

    Lightning's `ModelCheckpoint(save_last=True)` writes last.ckpt only when its monitored metric improved,
    and cannot combine step and epoch triggers; a resume needs the latest state, every time.
    """

    def __init__(self, dirpath: str, filename: str = "last", every_n_train_steps: int | None = None) -> None:
        if every_n_train_steps is not None and every_n_train_steps < 1:
            raise ValueError(
                f"callbacks.last_checkpoint.every_n_train_steps={every_n_train_steps} must be >= 1 or null"
            )
        self.path = Path(dirpath) / f"{filename}.ckpt"
        self.every_n_train_steps = every_n_train_steps
        self._saved_step: int | None = None

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if self.every_n_train_steps and trainer.global_step % self.every_n_train_steps == 0:
            self._save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer)  # runs after the epoch's validation, so the state includes its results

    def _save(self, trainer: L.Trainer) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run or trainer.state.fn != TrainerFn.FITTING:
            return
        if self._saved_step == trainer.global_step:
            return  # nothing new since the last save
        trainer.save_checkpoint(self.path, weights_only=False)  # atomic: src/utils/checkpoints.py
        self._saved_step = trainer.global_step
