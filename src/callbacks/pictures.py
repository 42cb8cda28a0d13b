"""What the picture callbacks share: when to draw, what to collect, and where the pictures go.

A subclass (prediction_pictures.py for classifiers, segmentation_pictures.py for segmenters) says which tasks it
fits and draws its pictures from what this base collected over a val or test epoch: a confusion matrix of
every prediction against its target (summed over all DDP ranks) and the first `num_samples` samples.

Pictures are made at the end of validation (every `every_n_epochs` epochs) and of testing, and sent to each
logger that shows images, through its own API: wandb (`WandbLogger.log_image`), TensorBoard (`add_image`) and
MLflow (`log_image`). The test pictures are also saved as PNG files in `save_dir`, so a run without such a
logger has them too. With no image logger, validation collects nothing and costs nothing.
"""

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix

from src.common.classes import names_or_indices

if TYPE_CHECKING:  # matplotlib is imported when a picture is drawn
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

IMAGE_LOGGERS = (WandbLogger, TensorBoardLogger, MLFlowLogger)

# One sample as kept for drawing, on the CPU: (image (C, H, W), prediction, target); a classifier's
# prediction and target are class indices (0-d), a segmenter's are (H, W) masks.
Sample = tuple[Tensor, Tensor, Tensor]


class Pictures(L.Callback):
    """The base of the picture callbacks, for modules whose val/test steps return
    `{"preds": class indices, "targets": the same shape}` (TaskModule does).

    The confusion matrix leaves out the targets equal to the module's `ignore_index` hyperparameter, when it
    has one. Subclasses set `tasks` and `name` and implement `draw`.
    """

    tasks: tuple[str, ...] = ()  # the model tasks it fits (src/run/builder.py leaves it out of the others)
    name = "pictures"  # its key under `callbacks`, for error messages

    def __init__(self, num_samples: int, every_n_epochs: int, save_dir: str | None) -> None:
        if num_samples < 0 or every_n_epochs < 1:
            raise ValueError(
                f"callbacks.{self.name}: num_samples={num_samples} must be >= 0 and "
                f"every_n_epochs={every_n_epochs} >= 1"
            )
        self.num_samples = num_samples
        self.every_n_epochs = every_n_epochs
        self.save_dir = save_dir
        self.ignore_index: int | None = None  # the module's, set when an epoch starts
        self._confusion: MulticlassConfusionMatrix | None = None
        self._samples: list[Sample] = []
        self._active = False
        self._said_not_images = False

    def draw(self, matrix: Tensor, samples: list[Sample], names: list[str]) -> dict[str, "Figure"]:
        """The pictures of one epoch as matplotlib Figures, by tag under the stage (`confusion_matrix` is
        logged as `val/confusion_matrix`); `matrix[true, predicted]` counts the epoch's predictions."""
        raise NotImplementedError(f"{type(self).__name__} must implement draw()")

    def idle_batch_hooks(self, trainer: L.Trainer) -> set[str]:
        """Without an image logger validation draws nothing: Lightning may skip its batch hook
        (src/run/builder.py)."""
        return set() if has_image_logger(trainer) else {"on_validation_batch_end"}

    # --- collecting ---

    def _start(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "val":
            self._active = (
                has_image_logger(trainer)
                and not trainer.sanity_checking
                and (trainer.current_epoch + 1) % self.every_n_epochs == 0
            )
        else:
            self._active = has_image_logger(trainer) or self.save_dir is not None
        if self._active:
            num_classes = pl_module.hparams.get("num_classes")
            self.ignore_index = pl_module.hparams.get("ignore_index")
            if (
                self._confusion is None
                or self._confusion.num_classes != num_classes
                or self._confusion.ignore_index != self.ignore_index
            ):
                # Predictions are argmax indices, always in range: no per-batch checks of the values.
                self._confusion = MulticlassConfusionMatrix(
                    num_classes, ignore_index=self.ignore_index, validate_args=False
                )
            self._confusion = self._confusion.to(pl_module.device)
            self._confusion.reset()
            self._samples = []

    def _collect(self, trainer: L.Trainer, outputs: Any, batch: Any) -> None:
        if not self._active:
            return
        if not isinstance(outputs, dict) or "preds" not in outputs or "targets" not in outputs:
            raise ValueError(
                f"callbacks.{self.name} needs validation_step/test_step to return "
                f"{{'preds': ..., 'targets': ...}}; return them, or remove the callback (callbacks.{self.name}=null)"
            )
        preds, targets = outputs["preds"], outputs["targets"]
        self._confusion.update(preds, targets)
        if len(self._samples) >= self.num_samples or not self._drawable(trainer, batch[0]):
            return
        for image, pred, target in zip(batch[0], preds, targets, strict=False):
            if len(self._samples) >= self.num_samples:
                break
            self._samples.append((image.detach().float().cpu(), pred.cpu(), target.cpu()))

    def _drawable(self, trainer: L.Trainer, inputs: Any) -> bool:
        """Whether a batch's inputs are images (batch, channels, height, width) that a sample picture can show.
        Other inputs (feature vectors, say) get no sample pictures, said once per run, and the pictures of
        the whole epoch are drawn as usual."""
        if isinstance(inputs, Tensor) and inputs.dim() == 4:
            return True
        if not self._said_not_images and trainer.is_global_zero:
            what = (
                f"have shape {list(inputs.shape[1:])}"
                if isinstance(inputs, Tensor)
                else f"are a {type(inputs).__name__}"
            )
            log.info(
                f"callbacks.{self.name}: the inputs {what}, not [channels, height, width] images: no sample "
                "pictures, only the pictures of the whole epoch"
            )
        self._said_not_images = True
        return False

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer, pl_module, "val")

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer, pl_module, "test")

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        self._collect(trainer, outputs, batch)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(trainer, outputs, batch)

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
        names = class_names(trainer, matrix.shape[0])
        for tag, figure in self.draw(matrix, self._samples, names).items():
            picture = to_rgb(figure)
            for logger in trainer.loggers:
                log_picture(logger, f"{stage}/{tag}", picture, trainer.global_step)
            if stage == "test" and self.save_dir is not None:
                from PIL import Image

                path = Path(self.save_dir) / f"{stage}_{tag}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(picture).save(path)


def has_image_logger(trainer: L.Trainer) -> bool:
    return any(isinstance(logger, IMAGE_LOGGERS) for logger in trainer.loggers)


def class_names(trainer: L.Trainer, num_classes: int) -> list[str]:
    """The datamodule's `class_names` hyperparameter when it has one, else the indices."""
    names = getattr(trainer.datamodule, "hparams", {}).get("class_names") if trainer.datamodule else None
    return names_or_indices(names, num_classes)


def log_picture(logger: Any, tag: str, picture: np.ndarray, step: int) -> None:
    """Send an RGB picture (H, W, 3) uint8 to one logger through its own image API."""
    if isinstance(logger, WandbLogger):
        logger.log_image(key=tag, images=[picture], step=step)
    elif isinstance(logger, TensorBoardLogger):
        logger.experiment.add_image(tag, picture, global_step=step, dataformats="HWC")
    elif isinstance(logger, MLFlowLogger):
        logger.experiment.log_image(logger.run_id, picture, key=tag, step=step)


def to_rgb(figure: "Figure") -> np.ndarray:
    """A matplotlib Figure as an RGB picture (H, W, 3) uint8 of its size in inches times its dpi."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
