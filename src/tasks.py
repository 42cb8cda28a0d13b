"""The tasks the train and eval entry points run. Each reads top to bottom; `build` does the wiring."""

import logging
import warnings

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig

from src.run.builder import build, complete_config
from src.run.checkpoints import check_checkpoint, check_fits
from src.run.extras import CALLBACK_STATES_WARNING
from src.run.hardware import fit_precision
from src.run.resume import plan_resume
from src.run.trained_run import locate, with_run_config, with_run_precision

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit the model (continuing a named run where it stopped), then test the best checkpoint."""
    complete_config(cfg)  # the keys the data fills in, as the run record has them
    fit_precision(cfg.trainer)  # trainer.precision=auto: bf16-mixed or 32 here, as the record has it
    resume = plan_resume(cfg)  # before anything heavy: a run that may not continue fails in a second
    ckpt_path = cfg.get("ckpt_path") or (str(resume.checkpoint) if resume and resume.checkpoint else None)
    if ckpt_path is not None:
        check_checkpoint(ckpt_path)
    with build(cfg, resume=resume) as run:
        if ckpt_path is not None:
            check_fits(run.model, ckpt_path)
        if cfg.get("train"):
            log.info("Starting training")
            run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=ckpt_path, weights_only=True)
            _say_if_stopped_early(run.trainer)
        run.metrics = as_floats(run.trainer.callback_metrics)
        if cfg.get("test"):
            test_ckpt = _best_checkpoint(run.trainer) if cfg.get("train") else ckpt_path
            run.tested_checkpoint = test_ckpt
            log.info(f"Starting testing on {test_ckpt or 'the current weights'}")
            run.trainer.test(run.model, datamodule=run.datamodule, ckpt_path=test_ckpt, weights_only=True)
            run.metrics |= as_floats(run.trainer.callback_metrics)
    return run.metrics


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Test a checkpoint (`ckpt_path`, or the best one of `run_dir`) on the test split of its run's data, with
    its run's model config and precision; `data=`, `model=` and `trainer.precision=` on the command line
    choose others."""
    source = locate(cfg)
    cfg = with_run_precision(with_run_config(cfg, source, ("data", "model")), source)
    fit_precision(cfg.trainer)
    complete_config(cfg)
    with build(cfg) as run:
        check_fits(run.model, source.checkpoint)
        run.tested_checkpoint = str(source.checkpoint)
        log.info(f"Testing {source.checkpoint}")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", CALLBACK_STATES_WARNING)  # testing needs none of their states
            run.trainer.test(
                run.model, datamodule=run.datamodule, ckpt_path=str(source.checkpoint), weights_only=True
            )
        run.metrics = as_floats(run.trainer.callback_metrics)
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
    best = getattr(trainer.checkpoint_callback, "best_model_path", None)  # callbacks.model_checkpoint
    if not best:
        log.warning(
            "No best checkpoint was saved (fast_dev_run or no ModelCheckpoint): testing the current weights"
        )
    return best or None


@rank_zero_only
def _say_if_stopped_early(trainer) -> None:
    """One line when early stopping ended training: Lightning's EarlyStopping says why only with verbose=true,
    which also logs every validation check."""
    stopper = trainer.early_stopping_callback
    if stopper is not None and stopper.stopping_reason_message:
        reason = stopper.stopping_reason_message.removesuffix(" Signaling Trainer to stop.")
        log.info(f"Early stopping ended training after epoch {stopper.stopped_epoch}: {reason}")


def as_floats(metrics: dict) -> dict[str, float]:
    return {name: float(value) for name, value in metrics.items()}
