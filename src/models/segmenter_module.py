"""Semantic segmentation: any `net` from config that gives per-pixel class logits; cross-entropy (optionally
plus Dice) loss; pixel accuracy, mean IoU and Dice per stage, and the IoU of each class at test; predictions
written as mask images with coloured previews."""

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from PIL import Image
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassJaccardIndex

from src.callbacks.pictures import displayable
from src.callbacks.segmentation_pictures import class_palette
from src.data.components.labels import names_or_indices
from src.models.task_module import PredictInput, PredictionWriter, TaskModule


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
        net: dict,
        optimizer: dict,
        num_classes: int,
        ignore_index: int = 255,
        dice_weight: float = 0.0,
        class_weights: list[float] | None = None,
        scheduler: dict | None = None,
        scheduler_config: dict | None = None,
        compile: bool = False,
        channels_last: bool = False,
        class_names: list[str] | None = None,
        preprocessing: dict | None = None,
        monitor: str = "val/miou",
        mode: str = "max",
        freeze_backbone_epochs: int = 0,
        backbone_lr_scale: float = 1.0,
        decay_norm_and_bias: bool = False,
    ) -> None:
        if dice_weight < 0:
            raise ValueError(f"model.dice_weight={dice_weight} must be 0 (cross-entropy only) or more")
        if class_weights is not None and (len(class_weights) != num_classes or min(class_weights) < 0):
            raise ValueError(
                f"model.class_weights={list(class_weights)} must give one weight >= 0 per class "
                f"({num_classes}), or be null"
            )
        super().__init__(
            net=net,
            optimizer=optimizer,
            scheduler=scheduler,
            scheduler_config=scheduler_config,
            compile=compile,
            channels_last=channels_last,
            preprocessing=preprocessing,
            monitor=monitor,
            mode=mode,
            freeze_backbone_epochs=freeze_backbone_epochs,
            backbone_lr_scale=backbone_lr_scale,
            decay_norm_and_bias=decay_norm_and_bias,
            num_classes=num_classes,
            ignore_index=ignore_index,
            dice_weight=dice_weight,
            class_weights=class_weights,
            class_names=class_names,
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

    def prediction_writer(self, cfg: DictConfig, out_dir: Path) -> PredictionWriter:
        return SegmentationPredictions(self, cfg, out_dir)

    def output_description(self) -> dict[str, Any]:
        # The net keeps the input's height and width; an export takes the training input's size.
        size = (self.hparams.preprocessing.get("input_shape") or [None, "height", "width"])[1:]
        return {
            "name": "logits",
            "meaning": "per-pixel logits over the classes",
            "shape": ["batch", self.hparams.num_classes, *size],
            "softmax_for": "probabilities (over dim 1)",
            "argmax_for": "class indices (over dim 1)",
        }


PREVIEW_OPACITY = 0.5  # of the class colours over the image in a preview


def image_scores(mask: Tensor, target: Tensor, classes: int, ignore_index: int) -> dict[str, float | None]:
    """One image's pixel accuracy and mean IoU (over the classes in its prediction or label), its labelled
    pixels only, as the test metrics count them; None where no pixel is labelled."""
    labelled = target != ignore_index
    if not labelled.any():
        return {"acc": None, "miou": None}
    predicted, true = mask[labelled], target[labelled].long()
    counts = torch.bincount(true * classes + predicted, minlength=classes * classes).view(classes, classes)
    overlap = counts.diag()
    union = counts.sum(0) + counts.sum(1) - overlap
    present = union > 0
    return {
        "acc": (overlap.sum() / labelled.sum()).item(),
        "miou": (overlap[present] / union[present]).mean().item(),
    }


class SegmentationPredictions(PredictionWriter):
    """Per image: `masks/<index>[_<file name>].png`, the class index of each pixel as an 8-bit single-channel
    image (16-bit past 256 classes) at the input's own size (the probabilities resized back bilinearly when
    the preprocessing resized the image), and `previews/...png`, the classes in the segmentation pictures' colours over the
    image. One row per image: its files, size and the share of its pixels in each class; on a test split also
    its pixel accuracy and mean IoU against its label mask, and the test metrics over all images as
    `predict/acc`, `predict/miou`, `predict/dice` and `predict/iou_<class>`."""

    def __init__(self, module: TaskModule, cfg: DictConfig, out_dir: Path) -> None:
        super().__init__(module, cfg, out_dir)
        self.classes, self.ignore_index = module.hparams.num_classes, module.hparams.ignore_index
        self.names = names_or_indices(module.label_names(), self.classes)
        self.colours = class_palette(self.classes) * 255  # the segmentation pictures' colours
        self.test_metrics = module.stage_metrics("test")  # the test's own: predict/miou is test/miou
        shares = [f"share_{name}" for name in self.names]
        self.columns = ("index", "file", "mask", "preview", "height", "width", "acc", "miou", *shares)

    def add(self, outputs: Tensor, inputs: list[PredictInput]) -> None:
        for folder in ("masks", "previews"):
            (self.out_dir / folder).mkdir(parents=True, exist_ok=True)
        for probabilities, item in zip(outputs, inputs, strict=True):
            if item.file is not None:
                with Image.open(item.file) as file:
                    picture = np.asarray(file.convert("RGB"))
            else:
                picture = (
                    displayable(item.image.cpu()) * 255
                )  # data.loading=device keeps the test split on the GPU
            size = picture.shape[:2]
            if probabilities.shape[-2:] != size:  # the preprocessing resized the image
                probabilities = F.interpolate(probabilities[None].float(), size=size, mode="bilinear")[0]
            mask = probabilities.argmax(dim=0)
            name = f"{item.index:05d}" + (f"_{item.file.stem}" if item.file is not None else "")
            dtype = np.uint8 if self.classes <= 256 else np.uint16
            Image.fromarray(mask.numpy().astype(dtype)).save(self.out_dir / "masks" / f"{name}.png")
            preview = picture * (1 - PREVIEW_OPACITY) + self.colours[mask.numpy()] * PREVIEW_OPACITY
            Image.fromarray(preview.round().astype(np.uint8)).save(self.out_dir / "previews" / f"{name}.png")
            counts = torch.bincount(mask.flatten(), minlength=self.classes).tolist()
            row = {
                "index": item.index,
                "file": str(item.file) if item.file is not None else None,
                "mask": f"masks/{name}.png",
                "preview": f"previews/{name}.png",
                "height": size[0],
                "width": size[1],
            }
            if item.target is not None:
                target = torch.as_tensor(item.target).long().cpu()
                row |= image_scores(mask, target, self.classes, self.ignore_index)
                for metric in self.test_metrics.values():
                    metric.update(mask[None], target[None])
            shares = {name: count / mask.numel() for name, count in zip(self.names, counts, strict=True)}
            self.rows.append(row | {"class_shares": shares})

    def csv_row(self, row: dict[str, Any]) -> dict[str, Any]:
        shares = {f"share_{name}": share for name, share in row["class_shares"].items()}
        return {key: value for key, value in row.items() if key != "class_shares"} | shares

    def metrics(self) -> dict[str, float]:
        if not any("acc" in row for row in self.rows):
            return {}
        values = self.module.metric_values("predict", self.test_metrics)
        return {name: float(value) for name, value in values.items()}
