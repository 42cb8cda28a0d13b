"""The tasks the entry points run: train and evaluate. Each reads top to bottom; `build` does the wiring."""

import logging
import math

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from src.builder import build
from src.utils.checkpoints import check_checkpoint, check_fits
from src.utils.resume import plan_resume

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit the model (continuing a named run where it stopped), then test the best checkpoint."""
    resume = plan_resume(cfg)  # before anything heavy: a run that may not continue fails in a second
    if resume is not None:
        resume.apply_to_loggers(cfg)
    ckpt_path = cfg.get("ckpt_path") or (str(resume.checkpoint) if resume and resume.checkpoint else None)
    if ckpt_path is not None:
        check_checkpoint(ckpt_path)
    with build(cfg, resume=resume) as run:
        if ckpt_path is not None:
            check_fits(run.model, ckpt_path)
        if cfg.get("train"):
            log.info("Starting training")
            run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=ckpt_path, weights_only=True)
        run.metrics = _as_floats(run.trainer.callback_metrics)
        if cfg.get("test"):
            test_ckpt = _best_checkpoint(run.trainer) if cfg.get("train") else ckpt_path
            log.info(f"Starting testing on {test_ckpt or 'the current weights'}")
            run.trainer.test(run.model, datamodule=run.datamodule, ckpt_path=test_ckpt, weights_only=True)
            run.metrics |= _as_floats(run.trainer.callback_metrics)
    _report(run.metrics)
    return run.metrics


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Test the checkpoint `cfg.ckpt_path` on the test set of `cfg.data`; return the test metrics."""
    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise ValueError("eval needs a checkpoint: ckpt_path=logs/train/runs/<run>/checkpoints/best.ckpt")
    ckpt_path = check_checkpoint(cfg.ckpt_path)
    with build(cfg) as run:
        check_fits(run.model, ckpt_path)
        log.info(f"Testing {ckpt_path}")
        run.trainer.test(run.model, datamodule=run.datamodule, ckpt_path=str(ckpt_path), weights_only=True)
        run.metrics = _as_floats(run.trainer.callback_metrics)
    _report(run.metrics)
    return run.metrics


def optimized_metric(cfg: DictConfig, metrics: dict[str, float]) -> float | None:
    """The value a sweeper optimizes: `cfg.optimized_metric` (an error in a sweep when it was never logged)."""
    name = cfg.get("optimized_metric")
    if name is None:
        return None
    if name not in metrics:
        message = (
            f"optimized_metric={name} was not logged; logged metrics: {', '.join(sorted(metrics)) or 'none'}"
        )
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            raise ValueError(message)
        log.warning(message)
        return None
    return metrics[name]


def _best_checkpoint(trainer) -> str | None:
    """Path of the best checkpoint saved during fit, or None (test the current weights) when there is none."""
    callback = trainer.checkpoint_callback  # callbacks.model_checkpoint
    best = getattr(callback, "best_model_path", "") if callback is not None else ""
    if not best:
        log.warning(
            "No best checkpoint was saved (fast_dev_run or no ModelCheckpoint): testing the current weights"
        )
        return None
    return best


def _as_floats(metrics: dict) -> dict[str, float]:
    return {name: float(value) for name, value in metrics.items()}


@rank_zero_only
def _report(metrics: dict[str, float]) -> None:
    finite = {k: v for k, v in sorted(metrics.items()) if not math.isnan(v)}
    log.info("Final metrics: " + ", ".join(f"{k}={v:.4f}" for k, v in finite.items()))
