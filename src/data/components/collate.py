"""How a list of (image, label) samples becomes a batch: `stack` same-size images, or `pad` mixed sizes."""

import torch
from torch import Tensor


def stack_collate(batch: list[tuple[Tensor, int]]) -> tuple[Tensor, Tensor]:
    """Images of one size stacked into (B, C, H, W); a clear error when sizes differ."""
    images, labels = zip(*batch, strict=True)
    shapes = sorted({tuple(image.shape) for image in images})
    if len(shapes) > 1:
        raise ValueError(
            f"a batch holds images of different shapes {shapes[:4]}; resize them to one size in "
            "data.transforms (the default), or set data.collate=pad for a model that takes any size"
        )
    return torch.stack(images), torch.tensor(labels, dtype=torch.long)


def pad_collate(batch: list[tuple[Tensor, int]]) -> tuple[Tensor, Tensor, Tensor]:
    """Images of mixed sizes zero-padded at the bottom and right to the batch's largest height and width.

    Returns (images (B, C, H_max, W_max), labels (B,), sizes (B, 2) = each image's original (H, W)), so a
    model can mask the padding. After Normalize, zero is the dataset mean.
    """
    images, labels = zip(*batch, strict=True)
    channels = {image.shape[0] for image in images}
    if len(channels) > 1:
        raise ValueError(
            f"a batch mixes images with {sorted(channels)} channels; set data.image_mode (RGB or L)"
        )
    sizes = torch.tensor([image.shape[-2:] for image in images], dtype=torch.long)
    height, width = sizes.max(dim=0).values.tolist()
    padded = images[0].new_zeros((len(images), channels.pop(), height, width))
    for i, image in enumerate(images):
        padded[i, :, : image.shape[1], : image.shape[2]] = image
    return padded, torch.tensor(labels, dtype=torch.long), sizes


COLLATES = {"stack": stack_collate, "pad": pad_collate}
