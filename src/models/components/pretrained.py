"""What the nets with pretrained weights share (timm_net.py, torchvision_net.py): the check that a net takes the
data's images, and the preprocessing that follows the weights.

Such a net says two things the rest of the template reads:
- `head_module()`: the module it made anew for `num_classes`; everything else is the backbone, which fine-tuning
  freezes at first (model.freeze_backbone_epochs) and trains at a scaled rate (model.backbone_lr_scale);
- `weights_preprocessing(net_config)`, a class method: how the images its weights were trained on were
  prepared (mean, std, input size, interpolation), or None without weights. An image folder's datamodule
  copies these into the data keys its config leaves null, before anything is instantiated (its
  `complete_config`), so the datamodule's transforms, the checkpoints' preprocessing and so predict and export
  all use them.
"""

from pathlib import Path
from typing import Any

import torch
from torch import nn


def weights_preprocessing(
    mean: Any, std: Any, input_size: Any, interpolation: str, source: str
) -> dict[str, Any]:
    """A net's answer to `weights_preprocessing`, as plain data: `input_size` is [height, width]."""
    return {
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "input_size": [int(v) for v in list(input_size)[-2:]],
        "interpolation": str(interpolation),
        "source": source,
    }


def check_weights_file(weights_file: str) -> str:
    """`model.net.weights_file` as a string, once it is known to be a file."""
    if not Path(weights_file).is_file():
        raise FileNotFoundError(f"model.net.weights_file={weights_file} is not a file")
    return str(weights_file)


def check_input_size(model: nn.Module, input_shape: list[int], what: str, weights_size: list[int]) -> None:
    """Fail now, naming the fix, when `model` cannot take images of `input_shape` (a ViT made for 224x224 given
    28x28 digits): one forward pass of a blank batch, in eval mode so that no statistic moves."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape))
    except Exception as err:  # any failure here is the size's: the net was just built
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        height, width = weights_size
        raise ValueError(
            f"{what} does not take {input_shape[1]}x{input_shape[2]} images ({reason}); it was made for "
            f"{height}x{width}: set data.input_shape=[{input_shape[0]},{height},{width}] (data that "
            "resize their images; null takes the weights' size), or choose a net that takes any size"
        ) from err
    finally:
        model.train(was_training)
