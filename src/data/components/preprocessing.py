"""The data keys a data config leaves null that follow the net's pretrained weights (mean, std, interpolation,
input size), filled into the config before anything is instantiated: the datamodule's transforms, the
checkpoints' preprocessing and so predict and export then all use them.

A net class with weights says how their images were prepared with a class method,
`weights_preprocessing(net_config) -> dict | None` (the pretrained nets have one).
"""

import logging
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

# What a data key left null becomes when the net has no pretrained weights: ImageNet's statistics (those of
# most weights, and the image-folder data's before), and PIL's usual resampling.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_INTERPOLATION = "bilinear"


def follow_the_weights(cfg: DictConfig) -> None:
    """Fill the data keys left null (`mean`, `std`, `interpolation`, `input_shape`) from the net's pretrained
    weights (model.net with weights), else with the defaults above; a key the data config sets wins.

    `input_shape: null` takes the weights' size with `image_mode`'s channels; without weights it has no
    default and is refused, naming the fix.
    """
    data, net = cfg.get("data"), OmegaConf.select(cfg, "model.net")
    if not isinstance(data, DictConfig) or not any(
        key in data and data[key] is None for key in ("mean", "std", "interpolation", "input_shape")
    ):
        return
    known = None
    if isinstance(net, DictConfig) and "_target_" in net:
        net_class = get_object(net._target_)
        if hasattr(net_class, "weights_preprocessing"):
            known = net_class.weights_preprocessing(OmegaConf.to_container(net, resolve=False))
    channels = 1 if data.get("image_mode") == "L" else 3
    if "input_shape" in data and data.input_shape is None:
        if known is None:
            raise ValueError(
                "data.input_shape=null takes the size of the net's pretrained weights, but "
                f"model/net={_option(net)} has none; give the size, e.g. data.input_shape=[{channels},64,64]"
            )
        data.input_shape = [channels, *known["input_size"]]
    mean, std = (known["mean"], known["std"]) if known else (IMAGENET_MEAN, IMAGENET_STD)
    if channels == 1 and len(mean) == 3:  # grayscale images into weights of RGB ones: their average
        mean, std = [sum(mean) / 3], [sum(std) / 3]
    filled = {
        "mean": list(mean),
        "std": list(std),
        "interpolation": known["interpolation"] if known else DEFAULT_INTERPOLATION,
    }
    for key, value in filled.items():
        if key in data and data[key] is None:
            data[key] = value
    if known:
        log.info(
            f"Preprocessing follows {known['source']}: {data.input_shape}, mean {data.mean}, std {data.std}"
        )


def _option(net: Any) -> str:
    target = str(net.get("_target_", "?")) if isinstance(net, DictConfig) else "?"
    return target.rsplit(".", 1)[-1]
