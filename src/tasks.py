"""The tasks the entry points run: train, evaluate, predict, export. Each reads top to bottom; `build` does the
wiring. (The fifth entry point's task, `report`, reads run dirs only and imports neither torch nor Lightning:
it is src/reports.py's.)"""

import logging
import math
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig

from src.inference import export_formats, export_sidecar
from src.inference.inputs import inputs
from src.inference.predictions import ToWriter
from src.run.builder import build
from src.run.checkpoints import check_checkpoint, check_fits
from src.run.resume import plan_resume
from src.run.trained_run import load_model, locate, with_run_config, with_run_precision

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
    """Test a checkpoint (`ckpt_path`, or the best one of `run_dir`) on the test split of its run's data, with
    its run's model config and precision; `data=`, `model=` and `trainer.precision=` on the command line
    choose others."""
    source = locate(cfg)
    cfg = with_run_precision(with_run_config(cfg, source, ("data", "model")), source)
    with build(cfg) as run:
        check_fits(run.model, source.checkpoint)
        log.info(f"Testing {source.checkpoint}")
        run.trainer.test(
            run.model, datamodule=run.datamodule, ckpt_path=str(source.checkpoint), weights_only=True
        )
        run.metrics = _as_floats(run.trainer.callback_metrics)
    _report(run.metrics)
    return run.metrics


def predict(cfg: DictConfig) -> list[dict[str, Any]]:
    """Predict with a trained checkpoint on image files (`inputs`) or on a datamodule's test split; the task's
    PredictionWriter writes the predictions into this run's directory (predictions.csv and .json, and per
    image what the task adds: a segmentation's masks) and gives the `predict/` metrics of a test split."""
    source = locate(cfg)
    model = load_model(source, cfg.get("module"))
    writer = model.prediction_writer(cfg, Path(cfg.paths.output_dir))  # before any work: a task may have none
    if cfg.get("compile"):
        model.net.compile()
    images = inputs(cfg, source, model, cfg.batch_size)
    log.info(f"Predicting {len(images.loader.dataset)} images with {source.checkpoint}")
    with build(cfg, model=model, datamodule=images.datamodule) as run:
        run.trainer.callbacks.append(ToWriter(writer, images.each()))  # batch by batch
        run.trainer.predict(model, dataloaders=images.loader, return_predictions=False)
        run.metrics = writer.finish()
    _report(run.metrics)
    return writer.rows


def export(cfg: DictConfig) -> Path:
    """Write the checkpoint's net as `cfg.format`, check the artifact against the model on real images,
    and write beside it what preprocessing its inputs need."""
    name = cfg.get("format")
    if name not in export_formats.FORMATS:
        raise ValueError(
            f"format={name} is not an export format; choose one of {', '.join(export_formats.FORMATS)}"
        )
    fmt = export_formats.FORMATS[name]
    source = locate(cfg)
    model = load_model(source, cfg.get("module"))
    model.output_description()  # before anything is written: a task module that cannot say what it outputs fails
    artifact = Path(cfg.output) if cfg.get("output") else source.checkpoint.with_suffix(fmt.suffix)
    if artifact.exists() and not cfg.get("overwrite"):
        raise FileExistsError(
            f"{artifact} exists; give output=<another path>, or overwrite=true to replace it"
        )
    export_formats.require(fmt.packages, f"format={name}")  # before anything is written
    images = inputs(cfg, source, model, cfg.parity_samples).first(cfg.parity_samples)
    if len(images) < 2:
        raise ValueError(
            f"the parity check needs at least 2 images (parity_samples={cfg.parity_samples}), found {len(images)}"
        )
    with build(cfg, model=model, trainer=False) as run:
        log.info(f"Exporting {source.checkpoint} as {name} to {artifact}")
        with export_formats.staged(artifact) as written:
            fmt.save(model, images, written)
            candidate = fmt.load(written, model.hparams.net)
            what = f"{name} export {artifact}"
            worst = export_formats.check_parity(model, candidate, images, cfg.tolerance, what)
        log.info(
            f"Parity check passed: outputs differ from the model's by at most {worst:.3g} (tolerance {cfg.tolerance:g})"
        )
        export_sidecar.write_sidecar(artifact, model, name, worst, cfg.tolerance, source.checkpoint)
        run.metrics = {"export/max_diff": worst}
    return artifact


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
    # Predictions on image files without labels have none.
    log.info("Final metrics: " + (", ".join(f"{k}={v:.4f}" for k, v in finite.items()) or "none"))
