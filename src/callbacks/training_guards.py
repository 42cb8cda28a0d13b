"""Guards against the classic training pitfalls: a suspicious first loss, a NaN/Inf loss, unused parameters."""

import logging
import math

import lightning as L
import torch
from lightning.pytorch.utilities import grad_norm

log = logging.getLogger(__name__)


class TrainingGuards(L.Callback):
    """Checks made while training, each behind its own switch (configs/callbacks/training_guards.yaml)."""

    def __init__(
        self,
        check_initial_loss: bool = True,
        stop_on_nonfinite: bool = True,
        warn_unused_parameters: bool = True,
        log_grad_norm: bool = False,
    ) -> None:
        self.check_initial_loss = check_initial_loss
        self.stop_on_nonfinite = stop_on_nonfinite
        self.warn_unused_parameters = warn_unused_parameters
        self.log_grad_norm = log_grad_norm
        self._first_step = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first_step = trainer.global_step == 0  # a resumed run is past its first step

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        if self.stop_on_nonfinite:
            broken = not bool(torch.isfinite(loss.detach()).all())
            # Every rank stops together, whichever one saw it.
            if trainer.strategy.reduce_boolean_decision(broken, all=False):
                raise FloatingPointError(
                    f"the training loss is {loss.item() if broken else 'NaN/Inf on another rank'} at epoch "
                    f"{trainer.current_epoch}, step {trainer.global_step}: stopped before it reached the weights; "
                    "lower model.optimizer.lr, set trainer.gradient_clip_val, check the data (mean/std, "
                    "labels), or find the operation with trainer.detect_anomaly=true"
                )
        num_classes = pl_module.hparams.get("num_classes")
        if self._first_step and self.check_initial_loss and num_classes and trainer.is_global_zero:
            expected, value = math.log(num_classes), loss.item()
            if not expected / 2 <= value <= expected * 2:
                log.warning(
                    f"The first batch's loss is {value:.3g}, far from ln({num_classes}) = {expected:.3g}, what an "
                    "untrained classifier should give: check the input normalisation (data.mean, data.std), "
                    "the labels, and the net's last layer"
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

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self.log_grad_norm:
            pl_module.log_dict(grad_norm(pl_module, norm_type=2))
