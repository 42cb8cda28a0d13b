"""The tasks of the predict and export entry points: each loads a trained checkpoint, runs it on image files
or a test split, and writes what it made into its run directory (or beside the checkpoint)."""

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from src.inference import export_formats, export_sidecar
from src.inference.inputs import inputs
from src.inference.predictions import ToWriter
from src.run.builder import build
from src.run.trained_run import load_model, locate

log = logging.getLogger(__name__)


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
    batches = model.export_inputs(inputs(cfg, source, model, cfg.parity_samples).first(cfg.parity_samples))
    names, count = list(batches[0]), len(next(iter(batches[0].values())))
    if count < 2:
        raise ValueError(
            f"the parity check needs at least 2 inputs (parity_samples={cfg.parity_samples}), found {count}"
        )

    def reference(*tensors: Any) -> Any:
        """The model as it trained (a text net's LoRA adapters unmerged), on inputs as its data gives them."""
        return model(tensors[0] if len(tensors) == 1 else dict(zip(names, tensors, strict=True)))

    with build(cfg, model=model, trainer=False) as run:
        log.info(f"Exporting {source.checkpoint} as {name} to {artifact}")
        with export_formats.staged(artifact) as written:
            fmt.save(model, batches[0], written)
            candidate = fmt.load(written, model.hparams.net)
            what = f"{name} export {artifact}"
            worst = export_formats.check_parity(reference, candidate, batches, cfg.tolerance, what)
        log.info(
            f"Parity check passed: outputs differ from the model's by at most {worst:.3g} (tolerance {cfg.tolerance:g})"
        )
        export_sidecar.write_sidecar(artifact, model, name, worst, cfg.tolerance, source.checkpoint)
        run.metrics = {"export/max_diff": worst}
    return artifact
