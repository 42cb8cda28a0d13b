"""What predict writes for a text classifier: a classifier's rows (src/inference/classification_predictions.py)
with the text each is for, cut to its first characters."""

from pathlib import Path
from typing import Any

from lightning import LightningModule
from omegaconf import DictConfig
from torch import Tensor

from src.common.text import load_tokenizer
from src.inference.classification_predictions import ClassificationPredictions
from src.inference.predictions import PredictInput

TEXT_SHOWN = 80  # characters of each text in its row


class TextPredictions(ClassificationPredictions):
    """One row per text: `index` (its row in the inputs), `text` (its first characters), the predicted class,
    its probability and the `top_k` most likely classes; on a test split also the label and `predict/acc`. A
    test split's samples are token ids, so its texts are the ids decoded (lowercased by most tokenizers)."""

    columns = ("index", "text", "label", "label_name", "predicted", "predicted_name", "probability", "top_k")

    def __init__(self, module: LightningModule, cfg: DictConfig, out_dir: Path) -> None:
        super().__init__(module, cfg, out_dir)
        self.tokenizer = None  # loaded when a test split's ids need decoding

    def add(self, outputs: Tensor, inputs: list[PredictInput]) -> None:
        first = len(self.rows)
        super().add(outputs, inputs)
        for row, item in zip(self.rows[first:], inputs, strict=True):
            row["text"] = self.text_of(item)[:TEXT_SHOWN]

    def text_of(self, item: PredictInput) -> str:
        if item.text is not None:
            return item.text
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.module.hparams.preprocessing["tokenizer"])
        return self.tokenizer.decode(item.image.tolist(), skip_special_tokens=True)

    def csv_row(self, row: dict[str, Any]) -> dict[str, Any]:
        return super().csv_row(row) | {"text": row["text"]}
