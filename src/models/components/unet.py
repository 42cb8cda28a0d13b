"""A small U-Net for semantic segmentation: per-pixel class logits for images of any size."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _conv_block(in_channels: int, out_channels: int, batch_norm: bool) -> nn.Sequential:
    """Two 3x3 convolutions, each followed by BatchNorm (optional) and ReLU."""
    layers: list[nn.Module] = []
    for channels_in in (in_channels, out_channels):
        layers.append(nn.Conv2d(channels_in, out_channels, kernel_size=3, padding=1, bias=not batch_norm))
        if batch_norm:
            layers.append(nn.BatchNorm2d(out_channels))
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class UNet(nn.Module):
    """Ronneberger et al.'s U-Net, scaled down: an encoder that halves the image `len(channels) - 1` times, a
    decoder that doubles it back with transposed convolutions, joining the encoder's features of each size
    (skip connections), and a 1x1 convolution to `num_classes` logits per pixel.

    Any image size works: the input is padded to a multiple of 2**(len(channels) - 1) and the logits are
    cropped back, so an (N, C, H, W) batch gives (N, num_classes, H, W).
    """

    def __init__(
        self,
        input_shape: list[int],
        num_classes: int,
        channels: list[int] = (16, 32, 64),
        batch_norm: bool = True,
    ) -> None:
        super().__init__()
        if len(channels) < 2:
            raise ValueError(
                f"model.net.channels={list(channels)} needs at least two sizes (one downsampling)"
            )
        in_channels = input_shape[0]
        self.encoder = nn.ModuleList()
        for out_channels in channels:
            self.encoder.append(_conv_block(in_channels, out_channels, batch_norm))
            in_channels = out_channels
        self.upsample = nn.ModuleList()
        self.decoder = nn.ModuleList()
        for out_channels in reversed(channels[:-1]):
            self.upsample.append(nn.ConvTranspose2d(in_channels, out_channels, kernel_size=2, stride=2))
            self.decoder.append(_conv_block(2 * out_channels, out_channels, batch_norm))
            in_channels = out_channels
        self.head = nn.Conv2d(in_channels, num_classes, kernel_size=1)
        self.multiple = 2 ** (len(channels) - 1)

    def forward(self, x: Tensor) -> Tensor:
        height, width = x.shape[-2:]
        pad_h, pad_w = -height % self.multiple, -width % self.multiple
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        skips = []
        for i, block in enumerate(self.encoder):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for upsample, block, skip in zip(self.upsample, self.decoder, reversed(skips[:-1]), strict=True):
            x = block(torch.cat([upsample(x), skip], dim=1))
        return self.head(x)[..., :height, :width]
