"""Histograms of gradients and parameters, through each logger's own mechanism (off unless `log` is set)."""

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

CHOICES = ("gradients", "parameters", "all")


class Histograms(L.Callback):
    """wandb: `wandb.watch` (wandb collects them itself); TensorBoard: `add_histogram` every N steps."""

    def __init__(self, log: str | None = None, every_n_steps: int = 100) -> None:
        if log is not None and log not in CHOICES:
            raise ValueError(
                f"callbacks.histograms.log={log} is not valid; choose null, {', '.join(CHOICES)}"
            )
        if every_n_steps < 1:
            raise ValueError(f"callbacks.histograms.every_n_steps={every_n_steps} must be at least 1")
        self.what = log  # not `self.log`: the Trainer sets every callback's `log` to the module's log()
        self.every_n_steps = every_n_steps

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.what is None:
            return
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.watch(pl_module, log=self.what, log_freq=self.every_n_steps, log_graph=False)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        # Gradients are complete (and unscaled) here, right before the step uses them. This hook runs every
        # step: the cheap checks first.
        if self.what is None or trainer.global_step % self.every_n_steps:
            return
        boards = [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
        for name, parameter in pl_module.named_parameters():
            for kind, values in (("gradients", parameter.grad), ("parameters", parameter)):
                if values is None or self.what not in (kind, "all"):
                    continue
                for board in boards:
                    board.experiment.add_histogram(
                        f"{kind}/{name}", values.detach().float().cpu(), trainer.global_step
                    )
