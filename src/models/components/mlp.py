"""A fully connected classifier: the quickest net to train, for any fixed input shape."""

import math

from torch import Tensor, nn


class MLP(nn.Module):
    """Flatten the input, then `hidden_sizes` Linear-BatchNorm-ReLU-Dropout blocks and a Linear head."""

    def __init__(
        self,
        input_shape: list[int],
        num_classes: int,
        hidden_sizes: list[int] = (256, 128),
        dropout: float = 0.0,
        batch_norm: bool = True,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for hidden in hidden_sizes:
            layers.append(nn.Linear(width, hidden))
            if batch_norm:
                layers.append(nn.BatchNorm1d(hidden))
            layers += [nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
