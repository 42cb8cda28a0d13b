"""What predict writes for a segmenter: per image a mask file of class indices and a coloured preview, and
a row with its class shares (and on a test split its accuracy and IoU)."""

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from lightning import LightningModule
from omegaconf import DictConfig
from PIL import Image
from torch import Tensor

from src.common.classes import names_or_indices
from src.common.display import class_palette, displayable
from src.inference.predictions import PredictInput, PredictionWriter

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


def class_mask(probabilities: Tensor, size: tuple[int, int]) -> Tensor:
    """The class index of each pixel at the input's own (height, width): the probabilities resized back
    bilinearly when the preprocessing resized the image."""
    if tuple(probabilities.shape[-2:]) != tuple(size):
        probabilities = F.interpolate(probabilities[None].float(), size=tuple(size), mode="bilinear")[0]
    return probabilities.argmax(dim=0)


def mask_image(mask: Tensor, classes: int) -> Image.Image:
    """A mask as an 8-bit single-channel image (16-bit past 256 classes), ready to save as PNG."""
    return Image.fromarray(mask.cpu().numpy().astype(np.uint8 if classes <= 256 else np.uint16))


class SegmentationPredictions(PredictionWriter):
    """Per image: `masks/<index>[_<file name>].png`, the class index of each pixel as an 8-bit single-channel
    image (16-bit past 256 classes) at the input's own size (the probabilities resized back bilinearly when
    the preprocessing resized the image), and `previews/...png`, the classes in the segmentation pictures' colours over the
    image. One row per image: its files, size and the share of its pixels in each class; on a test split also
    its pixel accuracy and mean IoU against its label mask, and the test metrics over all images as
    `predict/acc`, `predict/miou`, `predict/dice` and `predict/iou_<class>`."""

    def __init__(self, module: LightningModule, cfg: DictConfig, out_dir: Path) -> None:
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
            else:  # .cpu(): data.loading=device keeps the test split on the GPU
                picture = displayable(item.image.cpu()) * 255
            size = picture.shape[:2]
            mask = class_mask(probabilities, size)
            name = f"{item.index:05d}" + (f"_{item.file.stem}" if item.file is not None else "")
            mask_image(mask, self.classes).save(self.out_dir / "masks" / f"{name}.png")
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
