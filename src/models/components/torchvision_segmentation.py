"""torchvision's semantic segmentation models (LR-ASPP, DeepLabV3, FCN) as a net that returns logits."""

from typing import Any

import torchvision
from torch import Tensor, nn


class TorchvisionSegmentation(nn.Module):
    """`torchvision.models.segmentation.<name>` with `num_classes` outputs, returning its "out" logits
    (N, num_classes, H, W) instead of a dict.

    `weights` and `weights_backbone` are torchvision's names or null (random initialisation); weights are
    downloaded on first use. These models take 3 channels: a grayscale input (input_shape [1, H, W]) is
    repeated to three.
    """

    def __init__(
        self,
        name: str,
        input_shape: list[int],
        num_classes: int,
        weights: str | None = None,
        weights_backbone: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        available = torchvision.models.list_models(module=torchvision.models.segmentation)
        if name not in available:
            raise ValueError(
                f"model.net.name={name} is not a torchvision segmentation model; choose one of {', '.join(available)}"
            )
        if input_shape[0] not in (1, 3):
            raise ValueError(
                f"model/net={name} takes 1 or 3 input channels, not data.input_shape[0]={input_shape[0]}"
            )
        self.repeat = 3 if input_shape[0] == 1 else 1
        self.model = torchvision.models.get_model(
            name, weights=weights, weights_backbone=weights_backbone, num_classes=num_classes, **kwargs
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.repeat > 1:
            x = x.expand(-1, self.repeat, -1, -1)
        return self.model(x)["out"]
