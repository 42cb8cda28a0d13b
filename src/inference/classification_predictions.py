"""What predict writes for a classifier: one row per image with the predicted class, its name and
probability, and the `top_k` most likely classes."""

from pathlib import Path
from typing import Any

from lightning import LightningModule
from omegaconf import DictConfig
from torch import Tensor

from src.common.classes import names_or_indices
from src.inference.predictions import PredictInput, PredictionWriter


class ClassificationPredictions(PredictionWriter):
    """One row per image: the predicted class, its name and probability, and the `top_k` most likely classes
    (predict's `top_k`); on a test split also the label, and `predict/acc`."""

    columns = ("index", "file", "label", "label_name", "predicted", "predicted_name", "probability", "top_k")

    def __init__(self, module: LightningModule, cfg: DictConfig, out_dir: Path) -> None:
        super().__init__(module, cfg, out_dir)
        self.names = names_or_indices(module.label_names(), module.hparams.num_classes)

    def add(self, outputs: Tensor, inputs: list[PredictInput]) -> None:
        top_p, top_i = outputs.topk(min(self.cfg.top_k, outputs.shape[1]), dim=1)
        for p_row, i_row, item in zip(top_p.tolist(), top_i.tolist(), inputs, strict=True):
            row = {
                "predicted": i_row[0],
                "predicted_name": self.names[i_row[0]],
                "probability": p_row[0],
                "top_k": [
                    {"class": i, "name": self.names[i], "probability": p}
                    for i, p in zip(i_row, p_row, strict=True)
                ],
                "index": item.index,
                "file": str(item.file) if item.file else None,
            }
            if item.target is not None:
                row |= {"label": int(item.target), "label_name": self.names[int(item.target)]}
            self.rows.append(row)

    def csv_row(self, row: dict[str, Any]) -> dict[str, Any]:
        return row | {"top_k": ";".join(f"{t['name']}:{t['probability']:.6f}" for t in row["top_k"])}

    def metrics(self) -> dict[str, float]:
        labelled = [row for row in self.rows if "label" in row]
        if not labelled:
            return {}
        return {"predict/acc": sum(row["predicted"] == row["label"] for row in labelled) / len(labelled)}
