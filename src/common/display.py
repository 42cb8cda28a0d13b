"""How images and classes look wherever they are shown: the picture callbacks draw with these, and
segmentation's prediction files colour their previews the same way."""

import numpy as np
from torch import Tensor


def displayable(image: Tensor) -> np.ndarray:
    """A normalised image (C, H, W) as RGB (H, W, 3) floats in 0..1, stretched from its min to its max: its
    first three channels, or its one channel as grey."""
    pixels = image - image.min()
    pixels = (pixels / (pixels.max() or 1)).permute(1, 2, 0).numpy()
    return np.repeat(pixels[..., :1], 3, axis=-1) if pixels.shape[-1] < 3 else pixels[..., :3]


def class_palette(num_classes: int) -> np.ndarray:
    """One fixed RGB colour per class (num_classes, 3), in 0..1: matplotlib's tab20 without its greys (the
    colour of ignored pixels), its 9 strong hues first and then their light tints; past 18 classes, as many
    colours spread over the turbo colour map."""
    from matplotlib import colormaps

    if num_classes <= 18:
        colours = [colour for i, colour in enumerate(colormaps["tab20"].colors) if i not in (14, 15)]
        return np.array(colours[0::2] + colours[1::2])[:num_classes]
    return colormaps["turbo"](np.linspace(0, 1, num_classes))[:, :3]
