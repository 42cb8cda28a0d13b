"""An exponential moving average (EMA) of the weights, which validation, checkpoints, testing, predict and export
use, while training goes on with the raw weights."""

import warnings
from numbers import Real
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, WeightAveraging
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import DictConfig

from src.common.config_names import target_class
from src.compat.lightning import averaged_model, latest_update_step, set_latest_update_step

SHARDING = (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy)  # strategies that may shard the weights


def is_number(value: Any) -> bool:
    """A real number, and not a bool (YAML's true and false are ints to Python)."""
    return isinstance(value, Real) and not isinstance(value, bool)


class EMA(WeightAveraging):
    """An exponential moving average of the weights: after every optimizer step the average moves towards them,
    `average = d * average + (1 - d) * weights` (the first update copies them). With `warmup_fraction` f the
    decay d after n updates is `min(decay, 1 - 1 / (1 + f * n))`: the average spans about the last f * n
    updates (f = 1: the plain mean of them all) until that reaches the 1/(1 - decay) steps of `decay`. A
    constant d instead holds on to the first step's weights for about 1/(1 - decay) steps, which a short run
    never outgrows. This is timm's and diffusers' warm-up `1 - (1 + n / gamma) ** -power` with power 1 and
    gamma 1/f. n is the AveragedModel's `n_averaged`, which checkpoints hold, so a resumed run continues it.

    Validation runs on the average; every checkpoint holds it as its `state_dict`, which eval, predict and export
    load, and the raw weights as `current_model_state`, with `n_averaged`, which a resumed fit continues from.
    Lightning's WeightAveraging with an averaging function (`avg_fn`) and `should_update`, its two documented
    extension points; `should_update` is EMAWeightAveraging's.

    What it changes, so that it works with the template's other callbacks:
    - Lightning puts the raw weights back whenever it loads a checkpoint into a module that has an average, so
      testing best.ckpt after fit, in the same Trainer (src/tasks.py), would test the raw weights. Here only a
      resumed fit does that; testing and predicting use the checkpoint's `state_dict`, the average.
    - A checkpoint saved at the end of a step by a callback that Lightning calls before this one
      (last_checkpoint's `every_n_train_steps`, an interrupt) would hold the average without that step, and a
      run resumed from it would never add it: that update is made before the checkpoint is written.
    - Validation runs with the average swapped into the module; after an interrupt in the middle of it (Ctrl+C,
      SIGTERM), a callback that saves on an exception (Lightning's `ModelCheckpoint(save_on_exception=True)`;
      the template's interrupt checkpoint saves nothing during validation) would save the two swapped. The raw
      weights are put back first (Lightning calls the checkpoint callbacks' `on_exception` after the others).
    - Lightning warns, for every module with a `configure_model` hook (TaskModule compiles its net there), that
      sharded layers are not supported: that warning is kept for the strategies that shard (fsdp, deepspeed).
    """

    _swapped = False  # whether validation has swapped the average into the module

    @staticmethod
    def check_config(cfg: DictConfig, key: str) -> None:
        """Refuse a weights-only checkpoint, which Lightning saves without asking callbacks: it would hold the raw
        weights (preflight runs this before anything is instantiated)."""
        for name, conf in cfg.callbacks.items():
            if (
                isinstance(conf, DictConfig)
                and issubclass(target_class(conf), ModelCheckpoint)
                and conf.get("save_weights_only")
            ):
                raise ValueError(
                    f"{key} puts the averaged weights into checkpoints, but with "
                    f"callbacks.{name}.save_weights_only=true Lightning saves them without asking callbacks, "
                    f"so they would hold the raw weights; keep callbacks.{name}.save_weights_only=false"
                )

    def __init__(
        self,
        decay: float = 0.99,
        warmup_fraction: float | None = 0.1,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
    ) -> None:
        if not (is_number(decay) and 0 <= decay <= 1):
            raise ValueError(
                f"callbacks.ema.decay={decay} is not valid; use a number from 0 to 1, such as 0.99"
            )
        if warmup_fraction is False:
            warmup_fraction = None  # `false` reads as "no warm-up" on the command line: the same as null
        if warmup_fraction is not None and not (is_number(warmup_fraction) and 0 < warmup_fraction <= 1):
            shown = "true" if warmup_fraction is True else warmup_fraction  # as it was written
            raise ValueError(
                f"callbacks.ema.warmup_fraction={shown} is not valid; use a number above 0 and at most 1 (0.1; "
                "1: the plain mean of all updates until the decay is reached), or null for no warm-up"
            )
        self.decay = float(decay)
        self.warmup_fraction = None if warmup_fraction is None else float(warmup_fraction)
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch
        super().__init__(device=device, use_buffers=use_buffers, avg_fn=self.average)

    def decay_after(self, num_averaged: torch.Tensor) -> torch.Tensor:
        """The warmed-up decay of the update that adds the weights to an average of `num_averaged` updates. A
        tensor on the average's device (float32: MPS has no float64), so that no update waits for the GPU."""
        return (1 - 1 / (1 + self.warmup_fraction * num_averaged.float())).clamp(max=self.decay)

    def average(
        self, average: torch.Tensor, weights: torch.Tensor, num_averaged: torch.Tensor
    ) -> torch.Tensor:
        """AveragedModel's `avg_fn`: the average after adding `weights` to an average of `num_averaged` updates.
        Without a warm-up, the arithmetic of torch's `get_ema_avg_fn`, which EMAWeightAveraging uses; a method,
        unlike that closure, so that the callback can be pickled (ddp_spawn)."""
        decay = self.decay if self.warmup_fraction is None else self.decay_after(num_averaged)
        return decay * average + (1 - decay) * weights

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """EMAWeightAveraging's: every `update_every_n_steps`-th step from `update_starting_at_step`, and every
        epoch end from `update_starting_at_epoch`."""
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            return started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0
        return (
            epoch_idx is not None
            and self.update_starting_at_epoch is not None
            and epoch_idx >= self.update_starting_at_epoch
        )

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        with warnings.catch_warnings():
            if not isinstance(trainer.strategy, SHARDING):
                warnings.filterwarnings("ignore", message=".*doesn't support sharding model layers")
            super().setup(trainer, pl_module, stage)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_epoch_start(trainer, pl_module)
        self._swapped = averaged_model(self) is not None  # the module holds the average until the epoch ends

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
        average = averaged_model(self)
        if (
            average is not None
            and trainer.state.fn == TrainerFn.FITTING
            and step > latest_update_step(self)
            and self.should_update(step_idx=step - 1)
        ):  # this step's update, which on_train_batch_end would make after the save
            average.update_parameters(pl_module)
            set_latest_update_step(self, step)
            checkpoint.get("callbacks", {}).get(self.state_key, {})["latest_update_step"] = step
        super().on_save_checkpoint(trainer, pl_module, checkpoint)

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
