"""A small convolutional classifier for single- or multi-channel images of any size."""

from torch import Tensor, nn


class SimpleCNN(nn.Module):
    """Conv-BatchNorm-ReLU-MaxPool blocks, adaptive average pooling to a fixed grid, and an MLP head.

    The adaptive pooling makes the head independent of the image size, so the same net trains on 8x8
    digits, 28x28 MNIST, or larger images.
    """

    def __init__(
        self,
        input_shape: list[int],
        num_classes: int,
        channels: list[int] = (32, 64),
        hidden_size: int = 128,
        dropout: float = 0.5,
        batch_norm: bool = True,
        pooled_size: int = 7,
    ) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        in_channels = input_shape[0]
        for out_channels in channels:
            blocks.append(nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=not batch_norm))
            if batch_norm:
                blocks.append(nn.BatchNorm2d(out_channels))
            blocks += [nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True)]
            in_channels = out_channels
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(pooled_size),
            nn.Flatten(),
            nn.Linear(in_channels * pooled_size**2, hidden_size),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_size, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))
