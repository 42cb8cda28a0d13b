"""Report a metric to the job's Optuna trial after each validation, and stop the run if Optuna prunes it."""

import lightning as L

from hydra_plugins.optuna_sweeper.optuna_sweeper import current_trial


class OptunaPruning(L.Callback):
    """Optuna pruning for runs launched by the Optuna sweeper; does nothing in any other run.

    Global rank 0 reports `monitor` to the trial at the end of every validation epoch and asks the study's
    pruner; the answer is broadcast, so every DDP rank stops together by raising `optuna.TrialPruned`,
    which the sweeper records as a pruned trial. (optuna-integration's callback needs the task to call
    `check_pruned()` after fit under DDP; the broadcast here keeps the ranks in step without it.)
    """

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor
        self._trial = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            self._trial = current_trial()  # None outside an Optuna sweep

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        verdict = self._ask(trainer) if trainer.is_global_zero else None
        verdict = trainer.strategy.broadcast(verdict)  # every rank acts on rank 0's verdict
        if verdict is None:
            return
        import optuna

        kind, message = verdict
        if kind == "error":
            raise ValueError(message)
        raise optuna.TrialPruned(message)

    def _ask(self, trainer: L.Trainer) -> tuple[str, str] | None:
        """Report to the trial; a ("pruned" or "error", message) verdict, or None to go on."""
        if self._trial is None:
            return None
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            logged = ", ".join(sorted(trainer.callback_metrics)) or "none"
            return (
                "error",
                f"callbacks.optuna_pruning.monitor={self.monitor} was not logged; logged: {logged}",
            )
        epoch = trainer.current_epoch
        self._trial.report(float(value), step=epoch)
        if self._trial.should_prune():
            return (
                "pruned",
                f"trial {self._trial.number} pruned after epoch {epoch}: {self.monitor}={float(value):.4g}",
            )
        return None
