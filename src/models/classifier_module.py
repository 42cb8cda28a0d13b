"""Image classification: any `net` from config that gives class logits, cross-entropy loss, accuracy per stage."""

import math
from pathlib import Path  # [part: predict]
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig  # [part: predict]
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from src.models.task_module import TaskModule


class ClassifierModule(TaskModule):
    """A batch is `(images, labels)` (data.collate=pad adds the images' sizes as a third item); the net maps
    images to (N, num_classes) logits. Logs `<stage>/loss` and `<stage>/acc`; a prediction is the class
    probabilities, which predict writes as one row per image (ClassificationPredictions).

    `class_names` need not be given: it is taken from the datamodule when training starts and saved with every
    checkpoint (with the preprocessing, see TaskModule), so that predict and export need nothing else.
    """

    task = "classification"

    def __init__(self, num_classes: int, class_names: list[str] | None = None, **kwargs: Any) -> None:
        # kwargs: TaskModule's arguments (net, optimizer, scheduler, ...), whose types preflight checks too.
        kwargs.setdefault("monitor", "val/acc")
        kwargs.setdefault("mode", "max")
        super().__init__(num_classes=num_classes, class_names=class_names, **kwargs)

    def stage_metrics(self, stage: str) -> dict[str, Metric]:
        return {"acc": MulticlassAccuracy(self.hparams.num_classes, average="micro", validate_args=False)}

    def step(self, batch: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
        x, y = batch[0], batch[1]
        logits = self(x)
        return F.cross_entropy(logits, y), logits.argmax(dim=1), y

    def predict_step(self, batch: Tensor | tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x = batch[0] if isinstance(batch, list | tuple) else batch
        return torch.softmax(self(x), dim=1)

    def initial_loss(self) -> tuple[float, str]:
        classes = self.hparams.num_classes
        expected = math.log(classes)
        return expected, f"ln({classes}) = {expected:.3g}, what an untrained classifier should give"

    # part: predict
    def prediction_writer(self, cfg: DictConfig, out_dir: Path) -> Any:
        from src.inference.classification_predictions import ClassificationPredictions

        return ClassificationPredictions(self, cfg, out_dir)

    def output_description(self) -> dict[str, Any]:
        return {
            "name": "logits",
            "shape": ["batch", self.hparams.num_classes],
            "softmax_for": "probabilities",
        }

    # /part
