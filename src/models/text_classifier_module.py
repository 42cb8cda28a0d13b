"""Text classification: a Hugging Face sequence classifier (model/net=hf) on tokenized, dynamically padded
batches; loss, metrics and predictions as for images (ClassifierModule)."""

from pathlib import Path  # [part: predict]
from typing import Any  # [part: predict]

import torch  # [part: predict]
from omegaconf import DictConfig  # [part: predict]
from torch import (
    Tensor,
    nn,  # [part: predict]
)

from src.models.classifier_module import ClassifierModule


class TextClassifierModule(ClassifierModule):
    """A batch is `(inputs, labels)`: `inputs` a dict of `input_ids` and `attention_mask` (B, L), L the
    batch's longest text, which the net maps to (B, num_classes) logits; `labels` (B,). ClassifierModule's
    `step` and `predict_step` take it as it is (a batch to predict may be the `inputs` dict alone)."""

    task = "text_classification"

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        return self.net(**inputs)

    # part: predict
    def prediction_writer(self, cfg: DictConfig, out_dir: Path) -> Any:
        from src.inference.text_predictions import TextPredictions

        return TextPredictions(self, cfg, out_dir)

    def export_inputs(self, batch: dict[str, Tensor]) -> list[dict[str, Tensor]]:
        """The ids and mask of a batch, and of its shortest few trimmed to their own longest text: the check
        then runs the artifact on two sequence lengths as well as two batch sizes."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        shortest = mask.sum(dim=1).argsort(stable=True)[: max(1, len(ids) // 2 - 1)]
        length = int(mask[shortest].sum(dim=1).max())
        return [
            {"input_ids": ids, "attention_mask": mask},
            {"input_ids": ids[shortest, :length], "attention_mask": mask[shortest, :length]},
        ]

    def export_axes(self) -> dict[str, dict[int, Any]]:
        """The batch and the sequence axis of both inputs, up to the longest sequence the net takes."""
        batch = torch.export.Dim("batch", min=1, max=4096)
        sequence = torch.export.Dim("sequence", min=1, max=self.net.max_length())
        return {name: {0: batch, 1: sequence} for name in ("input_ids", "attention_mask")}

    def export_net(self) -> nn.Module:
        """The net with any LoRA adapters merged into its weights: the artifact needs no peft."""
        return self.net.merged().eval()

    # /part
