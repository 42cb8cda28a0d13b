"""An exponential moving average (EMA) of the weights, which validation, checkpoints, testing, predict and export
use, while training goes on with the raw weights."""

import warnings
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EMAWeightAveraging
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn

SHARDING = (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy)  # strategies that may shard the weights


class EMA(EMAWeightAveraging):
    """Lightning's EMAWeightAveraging: after every optimizer step the average moves towards the weights,
    `average = decay * average + (1 - decay) * weights` (the first step copies them). Validation runs on the
    average; every checkpoint holds it as its `state_dict`, which eval, predict and export load, and the raw
    weights as `current_model_state`, with the average's step count, which a resumed fit continues from.

    What it changes, so that it works with the template's other callbacks:
    - Lightning puts the raw weights back whenever it loads a checkpoint into a module that has an average, so
      testing best.ckpt after fit, in the same Trainer (src/tasks.py), would test the raw weights. Here only a
      resumed fit does that; testing and predicting use the checkpoint's `state_dict`, the average.
    - A checkpoint saved at the end of a step by a callback that Lightning calls before this one
      (last_checkpoint's `every_n_train_steps`, an interrupt) would hold the average without that step, and a
      run resumed from it would never add it: that update is made before the checkpoint is written.
    - Validation runs with the average swapped into the module; an interrupt in the middle of it (Ctrl+C,
      SIGTERM) would save interrupted.ckpt with the two swapped. The raw weights are put back first
      (Lightning calls the checkpoint callbacks' `on_exception` after the others).
    - Lightning warns, for every module with a `configure_model` hook (TaskModule compiles its net there), that
      sharded layers are not supported: that warning is kept for the strategies that shard (fsdp, deepspeed).
    """

    _swapped = False  # whether validation has swapped the average into the module

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        with warnings.catch_warnings():
            if not isinstance(trainer.strategy, SHARDING):
                warnings.filterwarnings("ignore", message=".*doesn't support sharding model layers")
            super().setup(trainer, pl_module, stage)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_epoch_start(trainer, pl_module)
        self._swapped = self._average_model is not None  # the module holds the average until the epoch ends

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_epoch_end(trainer, pl_module)
        self._swapped = False

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if self._swapped:
            self.on_validation_epoch_end(trainer, pl_module)  # swaps the raw weights back in

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        step = trainer.global_step
        if (
            self._average_model is not None
            and trainer.state.fn == TrainerFn.FITTING
            and step > self._latest_update_step
            and self.should_update(step_idx=step - 1)
        ):  # this step's update, which on_train_batch_end would make after the save
            self._average_model.update_parameters(pl_module)
            self._latest_update_step = step
            checkpoint.get("callbacks", {}).get(self.state_key, {})["latest_update_step"] = step
        super().on_save_checkpoint(trainer, pl_module, checkpoint)

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
