"""How predict writes what a model predicts: a task's PredictionWriter gets each batch of `predict_step`
outputs with the inputs they are for, and writes predictions.json and predictions.csv (and per input what
the task adds, such as a segmentation's masks). A task module names its writer in `prediction_writer()`."""

import csv
import itertools
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning import LightningModule
from lightning.pytorch.callbacks import BasePredictionWriter
from omegaconf import DictConfig
from torch import Tensor

log = logging.getLogger(__name__)


@dataclass
class PredictInput:
    """One input of a predict run, as a PredictionWriter sees it."""

    index: int  # its place among the inputs: the row's `index`
    file: Path | None = None  # the image file it was read from (inputs=); None on a test split
    image: Tensor | None = None  # on a test split, the net's input (C, H, W); None for a file (read the file)
    target: Any = None  # on a test split, what is right (a class index, a mask); None for a file
    text: str | None = None  # a text read from inputs= (a text classifier's)  [part: text]


class PredictionWriter:
    """What `python src/predict.py` writes for one task: a task module returns one from `prediction_writer()`.

    predict hands it each batch of `predict_step` outputs with the inputs they are for (`add`, which appends
    one row per input to `rows` and may write a file per input, such as a mask), then calls `finish` once.
    `finish` writes the rows to predictions.json (as they are) and predictions.csv (`columns`, with
    `csv_row` flattening what does not fit in a cell) and returns `metrics()`, the `predict/<name>` values a
    test split's targets give (none for image files).
    """

    columns: tuple[str, ...] = ()  # the CSV's columns, in order; those the first row lacks are left out

    def __init__(self, module: LightningModule, cfg: DictConfig, out_dir: Path) -> None:
        self.module, self.cfg, self.out_dir = module, cfg, out_dir
        self.rows: list[dict[str, Any]] = []

    def add(self, outputs: Tensor, inputs: list[PredictInput]) -> None:
        """One row in `rows` for each input of a batch of `predict_step` outputs (and its files, if any)."""
        raise NotImplementedError(f"{type(self).__name__} must implement add()")

    def metrics(self) -> dict[str, float]:
        """The `predict/<name>` metrics over every row (those that need targets only on a test split)."""
        return {}

    def csv_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row as predictions.csv's cells."""
        return row

    def finish(self) -> dict[str, float]:
        """Write predictions.json and predictions.csv; return the metrics."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "predictions.json").write_text(json.dumps(self.rows, indent=1) + "\n")
        with open(self.out_dir / "predictions.csv", "w", newline="") as file:
            cells = [self.csv_row(row) for row in self.rows]
            writer = csv.DictWriter(file, fieldnames=[c for c in self.columns if c in (cells or [{}])[0]])
            writer.writeheader()
            writer.writerows({key: cell[key] for key in writer.fieldnames} for cell in cells)
        log.info(
            f"Wrote {len(self.rows)} predictions to {self.out_dir / 'predictions.csv'} and predictions.json"
        )
        return self.metrics()


class ToWriter(BasePredictionWriter):
    """Hands each batch of predictions, as it comes, to the task's PredictionWriter with the inputs it is for:
    predict holds one batch at a time (a segmentation test split's probability maps need not fit in memory)."""

    def __init__(self, writer: PredictionWriter, inputs: Iterator[PredictInput]) -> None:
        super().__init__(write_interval="batch")
        self.writer, self.inputs = writer, inputs

    def write_on_batch_end(
        self,
        trainer,
        pl_module,
        prediction: Any,
        batch_indices,
        batch,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        # The loader does not shuffle: its batches come in the order of `inputs`.
        self.writer.add(prediction.cpu(), list(itertools.islice(self.inputs, len(prediction))))
