"""Pictures of what a segmenter does: sample masks over their images, and the IoU of each class.

When they are drawn and where they go (wandb, TensorBoard, MLflow, PNG files in `save_dir` at test) is
shared with the classification pictures: src/callbacks/pictures.py.
"""

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from src.callbacks.pictures import Pictures, Sample
from src.common.display import class_palette, displayable

if TYPE_CHECKING:  # matplotlib is imported when a picture is drawn
    from matplotlib.figure import Figure

# Pixels whose target is the ignore_index: grey in the overlays, a colour no class has.
IGNORED = np.array([0.5, 0.5, 0.5])
# How much of an overlay pixel is its class's colour (the rest is the image, so the shapes stay visible).
TINT = 0.6


class SegmentationPictures(Pictures):
    """Sample rows of input | ground truth | prediction, and the per-class IoU as bars, for modules whose
    val/test steps return `{"preds": (N, H, W) class indices, "targets": (N, H, W) masks}` (SegmenterModule
    does).

    The IoU is computed from the pixel confusion matrix of the whole epoch (all ranks), leaving out the
    pixels whose target is the module's `ignore_index`: the same values as the module's `test/iou_<class>`.
    Class names come from the datamodule's `class_names` hyperparameter when it has one, else the indices.
    """

    tasks = ("segmentation",)
    name = "segmentation_pictures"

    def __init__(self, num_samples: int = 8, every_n_epochs: int = 1, save_dir: str | None = None) -> None:
        super().__init__(num_samples, every_n_epochs, save_dir)

    def draw(self, matrix: Tensor, samples: list[Sample], names: list[str]) -> dict[str, "Figure"]:
        pictures = {"iou_per_class": draw_iou(class_iou(matrix), names)}
        if samples:
            pictures["segmentations"] = draw_segmentations(samples, names, self.ignore_index)
        return pictures


def class_iou(matrix: Tensor) -> Tensor:
    """The intersection over union of each class from a confusion matrix `matrix[true, predicted]`; NaN for
    a class neither in the targets nor in the predictions."""
    matrix = matrix.double()
    hits = matrix.diagonal()
    union = matrix.sum(dim=0) + matrix.sum(dim=1) - hits
    return torch.where(union > 0, hits / union.clamp(min=1), torch.nan)


def overlay(image: Tensor, mask: Tensor, palette: np.ndarray, ignore_index: int | None) -> np.ndarray:
    """The image (C, H, W) tinted with the colour of each pixel's class in `mask` (H, W): RGB (H, W, 3) floats
    in 0..1; pixels with `ignore_index` are tinted grey."""
    labels = mask.long().numpy()
    ignored = labels == ignore_index if ignore_index is not None else np.zeros(labels.shape, bool)
    colours = np.where(ignored[..., None], IGNORED, palette[np.where(ignored, 0, labels)])
    return (1 - TINT) * displayable(image) + TINT * colours


def draw_segmentations(samples: list[Sample], names: list[str], ignore_index: int | None) -> "Figure":
    """One row per sample: the input, the ground truth and the prediction over it, with a legend of the
    class colours."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    palette = class_palette(len(names))
    legend = [Patch(color=colour, label=name) for colour, name in zip(palette, names, strict=True)]
    if ignore_index is not None and any((target == ignore_index).any() for _, _, target in samples):
        legend.append(Patch(color=IGNORED, label=f"ignored ({ignore_index})"))
    columns = min(len(legend), 6)
    legend_height = 0.25 * math.ceil(len(legend) / columns)
    figure = Figure(figsize=(5.4, 1.8 * len(samples) + 0.3 + legend_height), dpi=100, layout="constrained")
    axes = figure.subplots(len(samples), 3, squeeze=False)
    for row, (image, pred, target) in zip(axes, samples, strict=True):
        row[0].imshow(displayable(image))
        row[1].imshow(overlay(image, target, palette, ignore_index))
        row[2].imshow(overlay(image, pred, palette, ignore_index))
        for cell in row:
            cell.axis("off")
    for cell, title in zip(axes[0], ("input", "ground truth", "prediction"), strict=True):
        cell.set_title(title, fontsize=9)
    figure.legend(handles=legend, loc="outside lower center", ncols=columns, fontsize=7, frameon=False)
    return figure


def draw_iou(iou: Tensor, names: list[str]) -> "Figure":
    """A bar of each class's IoU (in its overlay colour), its value above it; a class absent from both the
    targets and the predictions (NaN) has no bar and says so. The title's mean is the module's `miou`."""
    from matplotlib.figure import Figure

    present = ~iou.isnan()
    figure = Figure(figsize=(2 + 0.45 * len(names), 3.5), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    bars = axes.bar(range(len(names)), iou.nan_to_num(0).numpy(), color=class_palette(len(names)))
    labels = [
        f"{value:.2f}" if known else "absent" for value, known in zip(iou.tolist(), present, strict=True)
    ]
    axes.bar_label(bars, labels=labels, fontsize=7)
    axes.set(ylim=(0, 1.1), ylabel="IoU", xticks=range(len(names)))
    axes.set_xticklabels(names, rotation=90 if max(map(len, names)) > 3 else 0)
    mean = iou[present].mean().item() if present.any() else float("nan")
    axes.set_title(f"IoU per class (mean over the classes present: {mean:.3f})", fontsize=9)
    return figure
