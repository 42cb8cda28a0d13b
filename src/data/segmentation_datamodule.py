"""Base of the segmentation datamodules: (image, mask) samples whose masks hold a class index per pixel."""

from collections.abc import Sequence
from typing import Any

import torch

from src.data.datamodule import DataModule


class SegmentationDataModule(DataModule):
    """A DataModule (see there) of `(image, mask)` samples: an image (C, H, W) and a mask (H, W) of class
    indices in 0..num_classes-1, or `ignore_index` for a pixel without a label (not counted in the loss or the
    metrics). `class_names` names the classes in index order (null: their indices). A subclass implements
    `load_datasets` and checks its masks with `check_mask`.
    """

    task = "segmentation"

    def __init__(
        self,
        num_classes: int,
        input_shape: Sequence[int],
        ignore_index: int = 255,
        class_names: Sequence[str] | None = None,
        **settings: Any,
    ) -> None:
        """`settings`: the DataModule's (split, batch_size, num_workers, ...; see there)."""
        if num_classes < 2:
            raise ValueError(f"data.num_classes={num_classes} must be at least 2 (background and one class)")
        if 0 <= ignore_index < num_classes:
            raise ValueError(
                f"data.ignore_index={ignore_index} is one of the {num_classes} classes; give a value outside "
                f"0..{num_classes - 1} (255 is the usual one)"
            )
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(
                f"data.class_names has {len(class_names)} names but data.num_classes={num_classes}; give one "
                "name per class, in index order, or null"
            )
        super().__init__(input_shape=input_shape, **settings)

    def check_mask(self, mask: torch.Tensor, where: str) -> None:
        """An error naming `where` (the mask's file) when a value is neither a class nor `ignore_index`."""
        classes, ignore = self.hparams.num_classes, self.hparams.ignore_index
        values = torch.unique(mask)
        bad = [int(v) for v in values if not (0 <= v < classes or v == ignore)]
        if bad:
            raise ValueError(
                f"{where} has mask value(s) {', '.join(map(str, bad[:10]))}, which are neither a class "
                f"(0..{classes - 1}, data.num_classes={classes}) nor data.ignore_index={ignore}"
            )
