"""Semantic segmentation: any `net` from config that gives per-pixel class logits; cross-entropy (optionally
plus Dice) loss; pixel accuracy, mean IoU and Dice per stage, and the IoU of each class at test; predictions
written as mask images with coloured previews."""

import math
from pathlib import Path  # [part: predict]
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig  # [part: predict]
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassJaccardIndex

from src.models.task_module import TaskModule


class SegmenterModule(TaskModule):
    """A batch is `(images, masks)`: images (N, C, H, W), masks (N, H, W) of class indices, with
    `ignore_index` where a pixel has no label; the net maps images to (N, num_classes, H, W) logits.

    Logs `<stage>/loss`, `<stage>/acc` (the share of labelled pixels classed right), `val|test/miou` (the
    intersection over union of each class, averaged over the classes present) and `val|test/dice`, and at
    test `test/iou_<class>` for every class. A prediction is the per-pixel class probabilities, which predict
    writes as a mask image and a coloured preview per image (SegmentationPredictions).

    Small classes (a few pixels each, against a background that fills most of the image) are learnt late, if at
    all: `class_weights` weighs each class's pixels in the cross-entropy (e.g. 0.1 for the background), and
    `dice_weight` > 0 adds that much of the soft Dice loss (1 - the mean Dice of the predicted probabilities),
    which counts every class alike. `class_names` need not be given: it is taken from the
    datamodule when training starts and saved with every checkpoint.
    """

    task = "segmentation"

    def __init__(
        self,
        num_classes: int,
        ignore_index: int = 255,
        dice_weight: float = 0.0,
        class_weights: list[float] | None = None,
        class_names: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        # kwargs: TaskModule's arguments (net, optimizer, scheduler, ...), whose types preflight checks too.
        if dice_weight < 0:
            raise ValueError(f"model.dice_weight={dice_weight} must be 0 (cross-entropy only) or more")
        if class_weights is not None and (len(class_weights) != num_classes or min(class_weights) < 0):
            raise ValueError(
                f"model.class_weights={list(class_weights)} must give one weight >= 0 per class "
                f"({num_classes}), or be null"
            )
        kwargs.setdefault("monitor", "val/miou")
        kwargs.setdefault("mode", "max")
        super().__init__(
            num_classes=num_classes,
            ignore_index=ignore_index,
            dice_weight=dice_weight,
            class_weights=class_weights,
            class_names=class_names,
            **kwargs,
        )
        weights = torch.tensor(class_weights, dtype=torch.float32) if class_weights is not None else None
        self.register_buffer("class_weights", weights, persistent=False)

    def stage_metrics(self, stage: str) -> dict[str, Metric]:
        classes, ignore = self.hparams.num_classes, self.hparams.ignore_index
        shared = {"ignore_index": ignore, "validate_args": False}
        metrics: dict[str, Metric] = {"acc": MulticlassAccuracy(classes, average="micro", **shared)}
        if stage == "train":
            return metrics  # the cheapest: training steps stay fast
        metrics["miou"] = MulticlassJaccardIndex(classes, average="macro", **shared)
        metrics["dice"] = MulticlassF1Score(classes, average="macro", multidim_average="global", **shared)
        if stage == "test":
            metrics["iou"] = MulticlassJaccardIndex(classes, average=None, **shared)  # one value per class
        return metrics

    def step(self, batch: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
        images, masks = batch[0], batch[1].long()  # masks may be stored as uint8
        logits = self(images)
        loss = F.cross_entropy(
            logits, masks, weight=self.class_weights, ignore_index=self.hparams.ignore_index
        )
        if self.hparams.dice_weight:
            loss = loss + self.hparams.dice_weight * self.dice_loss(logits, masks)
        return loss, logits.argmax(dim=1), masks

    def dice_loss(self, logits: Tensor, masks: Tensor) -> Tensor:
        """1 - the soft Dice of the predicted probabilities, averaged over the classes, labelled pixels only."""
        labelled = (masks != self.hparams.ignore_index).unsqueeze(1)
        probabilities = torch.softmax(logits, dim=1) * labelled
        targets = F.one_hot(masks.where(labelled.squeeze(1), 0), self.hparams.num_classes)
        targets = targets.permute(0, 3, 1, 2) * labelled
        overlap = (probabilities * targets).sum(dim=(0, 2, 3))
        total = probabilities.sum(dim=(0, 2, 3)) + targets.sum(dim=(0, 2, 3))
        return 1 - ((2 * overlap + 1) / (total + 1)).mean()

    def predict_step(self, batch: Tensor | tuple[Tensor, ...], batch_idx: int) -> Tensor:
        images = batch[0] if isinstance(batch, list | tuple) else batch
        return torch.softmax(self(images), dim=1)

    def initial_loss(self) -> tuple[float, str]:
        classes = self.hparams.num_classes
        expected = math.log(classes) + self.hparams.dice_weight  # an untrained net's soft Dice is about 0
        why = f"ln({classes}) = {math.log(classes):.3g} per pixel"
        if self.hparams.dice_weight:
            why += f" plus {self.hparams.dice_weight:g} x a Dice loss of about 1"
        return expected, why + ", what an untrained segmenter should give"

    # part: predict
    def prediction_writer(self, cfg: DictConfig, out_dir: Path) -> Any:
        from src.inference.segmentation_predictions import SegmentationPredictions

        return SegmentationPredictions(self, cfg, out_dir)

    def output_description(self) -> dict[str, Any]:
        # The net keeps the input's height and width; an export takes the training input's size.
        size = ((self.hparams.get("preprocessing") or {}).get("input_shape") or [None, "height", "width"])[1:]
        return {
            "name": "logits",
            "meaning": "per-pixel logits over the classes",
            "shape": ["batch", self.hparams.num_classes, *size],
            "softmax_for": "probabilities (over dim 1)",
            "argmax_for": "class indices (over dim 1)",
        }

    # /part
