"""Pictures of what a classifier does: a confusion matrix and a grid of sample predictions.

When they are drawn and where they go (wandb, TensorBoard, MLflow, PNG files in `save_dir` at test) is
shared with the segmentation pictures: src/callbacks/pictures.py.
"""

import math
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from src.callbacks.pictures import Pictures, Sample
from src.common.display import displayable

if TYPE_CHECKING:  # matplotlib is imported when a picture is drawn
    from matplotlib.figure import Figure


class PredictionPictures(Pictures):
    """Confusion matrix and sample predictions for modules whose val/test steps return preds and targets.

    The steps must return `{"preds": (B,) class indices, "targets": (B,)}` (TaskModule does). Class
    names come from the datamodule's `class_names` hyperparameter when it has one, else the indices.
    """

    tasks = ("classification",)
    name = "prediction_pictures"

    def __init__(self, num_samples: int = 16, every_n_epochs: int = 1, save_dir: str | None = None) -> None:
        super().__init__(num_samples, every_n_epochs, save_dir)

    def draw(self, matrix: Tensor, samples: list[Sample], names: list[str]) -> dict[str, "Figure"]:
        pictures = {"confusion_matrix": draw_confusion_matrix(matrix, names)}
        if samples:
            pictures["predictions"] = draw_predictions(samples, names)
        return pictures


def draw_confusion_matrix(matrix: Tensor, names: list[str]) -> "Figure":
    """Counts of (true class, predicted class), as a matplotlib Figure."""
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
    return figure


def draw_predictions(samples: list[Sample], names: list[str]) -> "Figure":
    """A grid of images titled `predicted (true)`: green when right, red when wrong."""
    from matplotlib.figure import Figure

    columns = math.ceil(math.sqrt(len(samples)))
    rows = math.ceil(len(samples) / columns)
    figure = Figure(figsize=(1.6 * columns, 1.8 * rows), dpi=100, layout="constrained")
    for i, (image, pred, target) in enumerate(samples):
        axes = figure.add_subplot(rows, columns, i + 1)
        axes.imshow(displayable(image))  # normalised images, shown min..max
        pred, target = int(pred), int(target)
        axes.set_title(
            f"{names[pred]} ({names[target]})", fontsize=8, color="green" if pred == target else "red"
        )
        axes.axis("off")
    figure.suptitle("predicted (true)", fontsize=9)
    return figure
