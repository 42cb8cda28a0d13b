"""Guards against the classic training pitfalls: a suspicious first loss, a NaN/Inf loss, unused parameters."""

import logging
import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import grad_norm  # [part: diagnostics]

log = logging.getLogger(__name__)


# Where reading the loss back costs a host sync (a GPU) or a collective (several processes), the non-finite
# check reads a flag kept on the device once per this many steps, unless told otherwise.
SYNC_FREE_INTERVAL = 50
FIXES = (
    "lower model.optimizer.lr, set trainer.gradient_clip_val, check the data (mean/std, labels), or find the "
    "operation with trainer.detect_anomaly=true"
)


class TrainingGuards(L.Callback):
    """Checks made while training, each behind its own switch (configs/callbacks/training_guards.yaml).

    The non-finite check looks at every step's loss. On a single CPU process it stops at the first bad one,
    before its backward pass; elsewhere reading the loss back every step would stall the device (a host sync)
    or all ranks (a collective), so by default the flag is read every SYNC_FREE_INTERVAL steps and at the end
    of each training epoch, before validation and the epoch's checkpoints.
    """

    def __init__(
        self,
        check_initial_loss: bool = True,
        stop_on_nonfinite: bool = True,
        nonfinite_every_n_steps: int | None = None,
        warn_unused_parameters: bool = True,
        log_grad_norm: bool = False,  # [part: diagnostics]
    ) -> None:
        if nonfinite_every_n_steps is not None and nonfinite_every_n_steps < 1:
            raise ValueError(
                f"callbacks.training_guards.nonfinite_every_n_steps={nonfinite_every_n_steps} must be >= 1 or "
                f"null (every step on one CPU process, else every {SYNC_FREE_INTERVAL})"
            )
        self.check_initial_loss = check_initial_loss
        self.stop_on_nonfinite = stop_on_nonfinite
        self.nonfinite_every_n_steps = nonfinite_every_n_steps
        self.warn_unused_parameters = warn_unused_parameters
        self.log_grad_norm = log_grad_norm  # [part: diagnostics]
        self._first_step = False
        self._interval = 1
        self._bad_steps: torch.Tensor | int = 0  # on the device: non-finite losses since the last read
        self._unread = 0  # steps since the last read

    def idle_batch_hooks(self, trainer: L.Trainer) -> list[str]:
        """The hooks this run does not need, which Lightning then skips (src/run/builder.py)."""
        idle = []
        if not self.log_grad_norm:  # [part: diagnostics]
            idle.append("on_before_optimizer_step")  # [part: diagnostics]
        if not self.stop_on_nonfinite or self._read_interval(trainer) == 1:
            idle.append("on_train_batch_end")  # nothing counted on the device to read back
        return idle

    def _read_interval(self, trainer: L.Trainer) -> int:
        """Every how many steps the non-finite flag is read: 1 on one CPU process (free), else the setting or
        SYNC_FREE_INTERVAL."""
        free = trainer.world_size == 1 and trainer.strategy.root_device.type == "cpu"
        return self.nonfinite_every_n_steps or (1 if free else SYNC_FREE_INTERVAL)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first_step = trainer.global_step == 0  # a resumed run is past its first step
        self._interval = self._read_interval(trainer)
        self._bad_steps, self._unread = 0, 0

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        if self.stop_on_nonfinite:
            # One process: a float comparison, no tensor ops; else counted on the device, read every N steps
            # (or now, with nonfinite_every_n_steps=1).
            if self._interval == 1 and trainer.world_size == 1:
                self._bad_steps, self._unread = int(not math.isfinite(loss.item())), 1
            else:
                self._bad_steps = self._bad_steps + (~torch.isfinite(loss.detach()).all()).int()
                self._unread += 1
            if self._interval == 1:
                self._stop_if_nonfinite(trainer)
        if self._first_step and self.check_initial_loss and trainer.is_global_zero:
            expected = getattr(pl_module, "initial_loss", lambda: None)()  # TaskModule.initial_loss
            if expected is not None and not expected[0] / 2 <= loss.item() <= expected[0] * 2:
                log.warning(
                    f"The first batch's loss is {loss.item():.3g}, far from {expected[1]}: check the input "
                    "normalisation (data.mean, data.std), the labels, and the net's last layer"
                )

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._first_step:
            return
        self._first_step = False
        if self.warn_unused_parameters and trainer.is_global_zero:
            unused = [name for name, p in pl_module.named_parameters() if p.requires_grad and p.grad is None]
            if unused:
                shown = ", ".join(unused[:10]) + (f" and {len(unused) - 10} more" if len(unused) > 10 else "")
                log.warning(
                    f"{len(unused)} parameter(s) got no gradient in the first step: {shown}; they are not used by "
                    "the loss (a branch never taken, a frozen layer that should say requires_grad=False?)"
                )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Every rank reads at the same steps (and at the epoch's last batch, before its validation and
        # checkpoints), so the collective matches up.
        if self._unread >= self._interval or (self._unread and batch_idx + 1 >= trainer.num_training_batches):
            self._stop_if_nonfinite(trainer)

    def _stop_if_nonfinite(self, trainer: L.Trainer) -> None:
        """Read the count of non-finite losses since the last read; every rank stops if one saw any."""
        bad, steps = int(self._bad_steps), self._unread
        self._bad_steps, self._unread = 0, 0
        if not trainer.strategy.reduce_boolean_decision(bad > 0, all=False):
            return
        at = f"epoch {trainer.current_epoch}, step {trainer.global_step}"
        if self._interval == 1:
            where = f"at {at}{'' if bad else ' on another rank'}: stopped before it reached the weights"
        else:
            where = (
                f"{f'in {bad} of' if bad else 'on another rank in one of'} the {steps} steps up to {at} (read "
                f"every {self._interval} steps; callbacks.training_guards.nonfinite_every_n_steps=1 stops at the "
                "first one, at one host sync per step)"
            )
        raise FloatingPointError(f"the training loss is NaN/Inf {where}; " + FIXES)

    # part: diagnostics
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self.log_grad_norm:
            pl_module.log_dict(grad_norm(pl_module, norm_type=2))

    # /part
