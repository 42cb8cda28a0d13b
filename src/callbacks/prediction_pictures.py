"""Pictures of what a classifier does: a confusion matrix and a grid of sample predictions.

Made at the end of validation (every `every_n_epochs` epochs) and of testing, and sent to each logger that
shows images, through its own API: wandb (`WandbLogger.log_image`), TensorBoard (`add_image`) and MLflow
(`log_image`). The test pictures are also saved as PNG files in `save_dir`, so a run without such a
logger has them too. With no image logger, validation draws nothing and costs nothing.
"""

import math
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix

from src.data.components.labels import names_or_indices

IMAGE_LOGGERS = (WandbLogger, TensorBoardLogger, MLFlowLogger)


class PredictionPictures(L.Callback):
    """Confusion matrix and sample predictions for modules whose val/test steps return preds and targets.

    The steps must return `{"preds": (B,) class indices, "targets": (B,)}` (TaskModule does). Class
    names come from the datamodule's `class_names` hyperparameter when it has one, else the indices.
    """

    # What it draws fits classifiers only (src/run/builder.py leaves it out of other tasks' runs).
    tasks = ("classification",)

    def __init__(self, num_samples: int = 16, every_n_epochs: int = 1, save_dir: str | None = None) -> None:
        if num_samples < 0 or every_n_epochs < 1:
            raise ValueError(
                f"callbacks.prediction_pictures: num_samples={num_samples} must be >= 0 and "
                f"every_n_epochs={every_n_epochs} >= 1"
            )
        self.num_samples = num_samples
        self.every_n_epochs = every_n_epochs
        self.save_dir = save_dir
        self._confusion: MulticlassConfusionMatrix | None = None
        self._samples: list[tuple[Tensor, int, int]] = []
        self._active = False

    # --- collecting ---

    def _start(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        has_image_logger = any(isinstance(logger, IMAGE_LOGGERS) for logger in trainer.loggers)
        if stage == "val":
            self._active = (
                has_image_logger
                and not trainer.sanity_checking
                and (trainer.current_epoch + 1) % self.every_n_epochs == 0
            )
        else:
            self._active = has_image_logger or self.save_dir is not None
        if self._active:
            num_classes = pl_module.hparams.get("num_classes")
            if self._confusion is None or self._confusion.num_classes != num_classes:
                self._confusion = MulticlassConfusionMatrix(num_classes)
            self._confusion = self._confusion.to(pl_module.device)
            self._confusion.reset()
            self._samples = []

    def _collect(self, outputs: Any, batch: Any) -> None:
        if not self._active:
            return
        if not isinstance(outputs, dict) or "preds" not in outputs or "targets" not in outputs:
            raise ValueError(
                "callbacks.prediction_pictures needs validation_step/test_step to return "
                "{'preds': ..., 'targets': ...}; return them, or remove the callback (callbacks.prediction_pictures=null)"
            )
        preds, targets = outputs["preds"], outputs["targets"]
        self._confusion.update(preds, targets)
        images = batch[0]
        for image, pred, target in zip(images, preds.tolist(), targets.tolist(), strict=False):
            if len(self._samples) >= self.num_samples:
                break
            self._samples.append((image.detach().float().cpu(), pred, target))

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer, pl_module, "val")

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer, pl_module, "test")

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        self._collect(outputs, batch)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(outputs, batch)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._finish(trainer, "val")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._finish(trainer, "test")

    # --- drawing and logging ---

    def _finish(self, trainer: L.Trainer, stage: str) -> None:
        if not self._active:
            return
        self._active = False
        matrix = self._confusion.compute().cpu()  # summed over every rank: all ranks must call it
        if not trainer.is_global_zero:
            return
        names = _class_names(trainer, matrix.shape[0])
        pictures = {f"{stage}/confusion_matrix": draw_confusion_matrix(matrix, names)}
        if self._samples:
            pictures[f"{stage}/predictions"] = draw_predictions(self._samples, names)
        for tag, picture in pictures.items():
            for logger in trainer.loggers:
                _log_picture(logger, tag, picture, trainer.global_step)
            if stage == "test" and self.save_dir is not None:
                from PIL import Image

                path = Path(self.save_dir) / f"{tag.replace('/', '_')}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(picture).save(path)


def _class_names(trainer: L.Trainer, num_classes: int) -> list[str]:
    names = getattr(trainer.datamodule, "hparams", {}).get("class_names") if trainer.datamodule else None
    return names_or_indices(names, num_classes)


def _log_picture(logger: Any, tag: str, picture: np.ndarray, step: int) -> None:
    """Send an RGB picture (H, W, 3) uint8 to one logger through its own image API."""
    if isinstance(logger, WandbLogger):
        logger.log_image(key=tag, images=[picture], step=step)
    elif isinstance(logger, TensorBoardLogger):
        logger.experiment.add_image(tag, picture, global_step=step, dataformats="HWC")
    elif isinstance(logger, MLFlowLogger):
        logger.experiment.log_image(logger.run_id, picture, key=tag, step=step)


def draw_confusion_matrix(matrix: Tensor, names: list[str]) -> np.ndarray:
    """Counts of (true class, predicted class), as an RGB picture."""
    from matplotlib.figure import Figure

    size = 2.5 + 0.45 * len(names)
    figure = Figure(figsize=(size, size), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    axes.imshow(matrix.numpy(), cmap="Blues")
    axes.set(xlabel="predicted", ylabel="true", xticks=range(len(names)), yticks=range(len(names)))
    axes.set_xticklabels(names, rotation=90)
    axes.set_yticklabels(names)
    if len(names) <= 30:  # the counts, where they fit
        top = matrix.max().item() or 1
        for (true, pred), count in np.ndenumerate(matrix.numpy()):
            colour = "white" if count > top / 2 else "black"
            axes.text(pred, true, str(count), ha="center", va="center", fontsize=7, color=colour)
    return _to_rgb(figure)


def draw_predictions(samples: list[tuple[Tensor, int, int]], names: list[str]) -> np.ndarray:
    """A grid of images titled `predicted (true)`: green when right, red when wrong."""
    from matplotlib.figure import Figure

    columns = math.ceil(math.sqrt(len(samples)))
    rows = math.ceil(len(samples) / columns)
    figure = Figure(figsize=(1.6 * columns, 1.8 * rows), dpi=100, layout="constrained")
    for i, (image, pred, target) in enumerate(samples):
        axes = figure.add_subplot(rows, columns, i + 1)
        pixels = image - image.min()
        pixels = (pixels / (pixels.max() or 1)).permute(1, 2, 0).numpy()  # normalised images, shown min..max
        axes.imshow(pixels[..., 0] if pixels.shape[-1] == 1 else pixels[..., :3], cmap="gray")
        axes.set_title(
            f"{names[pred]} ({names[target]})", fontsize=8, color="green" if pred == target else "red"
        )
        axes.axis("off")
    figure.suptitle("predicted (true)", fontsize=9)
    return _to_rgb(figure)


def _to_rgb(figure: Any) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
