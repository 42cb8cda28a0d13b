"""A learning-rate range test before training, whose suggested rate the run then trains with."""

import json
import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import LearningRateFinder
from lightning.pytorch.plugins.environments import TorchElasticEnvironment
from omegaconf import DictConfig, ListConfig

from src.common.config_names import GPU_ONLY_STRATEGIES, resolved_accelerator, strategy_name

log = logging.getLogger(__name__)

FILE_NAME = "lr_finder"  # <save_dir>/lr_finder.png and lr_finder.json


class LRFinder(LearningRateFinder):
    """Lightning's learning-rate finder, run when a new fit starts: `num_training_steps` steps with a rate that
    grows from `min_lr` to `max_lr`, then the weights, optimizer and loop counters are put back as they were.
    The suggestion, the rate where the smoothed loss falls fastest (`steepest_descent`), becomes the module's
    `optimizer.lr` hyperparameter, so the checkpoints say which rate trained them, and `configure_optimizers`
    builds the optimizer and its scheduler anew with it. The curve (`lr_finder.png`, the suggestion marked) and the numbers
    (`lr_finder.json`) go to `save_dir`; the suggestion also goes to run.json (`run_record`).

    A fit resumed from a checkpoint does not search again: the checkpoint's optimizer already trains with the
    rate found, and a new search there would replace the state it resumes from. With too few steps for a
    suggestion (or under fast_dev_run, where Lightning skips the search) the configured rate stays. One process
    only: `check_config` refuses it under DDP before the run starts.
    """

    @staticmethod
    def check_config(cfg: DictConfig, key: str) -> None:
        """Refuse a run in several processes (preflight runs this before anything is instantiated)."""
        settings = distributed_settings(cfg.trainer) if "trainer" in cfg else []
        if settings:
            choice = HydraConfig.get().runtime.choices.get("trainer") if HydraConfig.initialized() else None
            preset = f"trainer={choice}: " if choice not in (None, "default") else ""
            name = key.rsplit(".", 1)[-1]
            raise ValueError(
                f"{key} finds the learning rate in one process, but this run trains in several "
                f"({preset}{', '.join(settings)}); find the rate in a one-device run (trainer=cpu or "
                f"trainer=gpu), then train with model.optimizer.lr=<its suggestion> and without {name}"
            )

    def __init__(
        self,
        min_lr: float = 1e-8,
        max_lr: float = 1.0,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        save_dir: str | None = None,
    ) -> None:
        if not 0 < min_lr < max_lr:
            raise ValueError(
                f"callbacks.lr_finder: min_lr={min_lr} and max_lr={max_lr} must satisfy 0 < min_lr < max_lr"
            )
        # update_attr=False: Lightning's update looks for a `lr` attribute or hyperparameter and sets only
        # the optimizer's current rate, not the scheduler's; the rate is applied in on_fit_start instead.
        super().__init__(min_lr, max_lr, num_training_steps, mode, early_stop_threshold, update_attr=False)
        self.search = {
            "min_lr": min_lr,
            "max_lr": max_lr,
            "num_training_steps": num_training_steps,
            "mode": mode,
        }
        self.save_dir = Path(save_dir) if save_dir else None
        self.suggestion: float | None = None  # the rate found; in checkpoints, for the run's later attempts

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1:  # preflight refuses a config that asks for it; this is for other launches
            raise RuntimeError(
                f"callbacks.lr_finder runs in one process, but this fit has {trainer.world_size}; find the rate "
                "in a one-device run and train with model.optimizer.lr=<its suggestion>"
            )
        optimizer = _optimizer_config(pl_module)
        if trainer.ckpt_path is not None:
            if self.suggestion is not None:
                optimizer["lr"] = self.suggestion  # what the checkpoint's optimizer trains with
            found = (
                f" (lr={self.suggestion:.3g}, found by the run's first attempt)" if self.suggestion else ""
            )
            log.info(
                f"Resuming from {trainer.ckpt_path}: the learning rate is not searched again; training goes on "
                f"with the checkpoint's optimizer{found}"
            )
            return
        max_epochs, trainer.fit_loop.max_epochs = trainer.fit_loop.max_epochs, -1  # the search may take more
        try:
            self.lr_find(trainer, pl_module)
        finally:
            trainer.fit_loop.max_epochs = max_epochs
        trainer.ckpt_path = None  # the search restored its own temporary checkpoint; this fit resumes none
        if self.optimal_lr is None:  # fast_dev_run: Lightning skipped the search and said so
            return
        best = steepest_descent(self.optimal_lr.results, self.search["mode"])
        suggestion = None if best is None else self.optimal_lr.results["lr"][best]
        if suggestion is None:
            log.warning(
                f"The learning-rate finder recorded too few finite losses for a suggestion (raise "
                f"callbacks.lr_finder.num_training_steps): training with lr={optimizer['lr']}"
            )
        else:
            log.info(f"Learning-rate finder: training with its suggestion lr={suggestion:.3g}")
            self.suggestion = optimizer["lr"] = suggestion
            trainer.strategy.setup_optimizers(trainer)  # configure_optimizers, with the rate found
        if trainer.is_global_zero and self.save_dir is not None:
            self._save(best, optimizer)

    def _save(self, best: int | None, optimizer: dict[str, Any]) -> None:
        from matplotlib.figure import Figure

        results = self.optimal_lr.results
        suggestion = None if best is None else results["lr"][best]
        self.save_dir.mkdir(parents=True, exist_ok=True)
        figure = Figure(figsize=(6, 4), layout="constrained")
        axes = figure.subplots()
        self.optimal_lr.plot(ax=axes)  # the smoothed loss against the rate
        if best is not None:
            axes.plot(suggestion, results["loss"][best], marker="o", markersize=10, color="red")
        axes.set_title(f"suggested lr: {suggestion:.3g}" if suggestion is not None else "no suggestion")
        figure.savefig(self.save_dir / f"{FILE_NAME}.png", dpi=100)
        numbers = {
            "suggestion": suggestion,
            "lr_used": optimizer["lr"],
            **self.search,
            "lr": results["lr"],
            "loss": results["loss"],  # smoothed, as Lightning records it
        }
        (self.save_dir / f"{FILE_NAME}.json").write_text(json.dumps(numbers, indent=2) + "\n")

    def run_record(self) -> dict[str, Any]:
        """The entry of run.json (src/run/builder.py asks every callback that has this method)."""
        return {"lr_finder": {"suggestion": self.suggestion}}

    def state_dict(self) -> dict[str, Any]:
        return {"suggestion": self.suggestion}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.suggestion = state_dict.get("suggestion")


def distributed_settings(trainer: DictConfig) -> list[str]:
    """The settings that make the Trainer train in several processes (an empty list: one process)."""
    strategy, devices = trainer.get("strategy", "auto"), trainer.get("devices", "auto")
    count = len(devices) if isinstance(devices, ListConfig | list) else devices
    if count in ("auto", -1) and resolved_accelerator(trainer.get("accelerator", "auto")) == "cuda":
        count = torch.cuda.device_count()
    settings = []
    name = strategy_name(strategy)
    if "ddp" in name or name.startswith(tuple(GPU_ONLY_STRATEGIES)):
        shown = strategy["_target_"] if isinstance(strategy, DictConfig) else strategy
        settings.append(f"trainer.strategy={shown}")
    if count == -1 or (isinstance(count, int) and count > 1):
        settings.append(f"trainer.devices={devices}")
    if trainer.get("num_nodes", 1) > 1:
        settings.append(f"trainer.num_nodes={trainer.num_nodes}")
    if TorchElasticEnvironment.detect() and (processes := TorchElasticEnvironment().world_size()) > 1:
        settings.append(f"torchrun with {processes} processes")
    return settings


def steepest_descent(
    results: dict[str, list[float]], mode: str, skip_begin: int = 10, skip_end: int = 1
) -> int | None:
    """The index of the rate where the recorded loss falls fastest, leaving out the first `skip_begin` and last
    `skip_end` points and the non-finite losses, as Lightning's `suggestion()` does; None when fewer than two are
    left. In exponential mode the slope is taken against log(lr), the axis the rates are spaced on: Lightning 2.6
    takes it against lr itself, so the noise between its tiny first rates outweighs the real descent and it
    suggests rates near min_lr (Lightning-AI/pytorch-lightning#21141)."""
    losses = torch.tensor(results["loss"], dtype=torch.float64)
    lrs = torch.tensor(results["lr"], dtype=torch.float64)
    kept = torch.arange(len(losses))[skip_begin : len(losses) - skip_end]
    kept = kept[torch.isfinite(losses[kept])]
    if len(kept) < 2:
        return None
    axis = lrs[kept].log() if mode == "exponential" else lrs[kept]
    slope = torch.gradient(losses[kept], spacing=[axis])[0]
    return int(kept[slope.argmin()])


def _optimizer_config(module: L.LightningModule) -> dict[str, Any]:
    """The module's optimizer config, whose `lr` configure_optimizers builds the optimizer with (TaskModule's)."""
    optimizer = module.hparams.get("optimizer")
    if not isinstance(optimizer, dict) or "lr" not in optimizer:
        raise ValueError(
            f"callbacks.lr_finder sets the learning rate of the module's optimizer config (hparams.optimizer.lr, as "
            f"TaskModule in src/models/task_module.py keeps it), but {type(module).__name__} has none; "
            "drop lr_finder from callbacks"
        )
    return optimizer
