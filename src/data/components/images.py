"""Image files as a net's input, for the parts that read them (folders: datasets of files; predict: files given
to predict, and the preprocessing each datamodule records for it): what an image file is, and the transforms-v2
configs that turn one into a float tensor."""

import copy
from typing import Any

# What an image file is (what a folder of images or a glob is searched for).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")

# The steps every transforms-v2 pipeline needs at least, as config: PIL image to a tensor, then to float32 in
# [0, 1]. Configs (not objects) so that checkpoints can record the preprocessing for predict and export.
TO_IMAGE = {"_target_": "torchvision.transforms.v2.ToImage"}
TO_FLOAT = {
    "_target_": "torchvision.transforms.v2.ToDtype",
    "dtype": {"_target_": "hydra.utils.get_object", "path": "torch.float32"},
    "scale": True,
}


def compose(*steps: dict[str, Any]) -> dict[str, Any]:
    """The config of a transforms-v2 pipeline of `steps` (copies: a caller may store or change it)."""
    return {"_target_": "torchvision.transforms.v2.Compose", "transforms": copy.deepcopy(list(steps))}


def standard_transform(size: list[int], mean: list[float], std: list[float]) -> dict[str, Any]:
    """PIL image -> tensor resized to `size` -> float32 in [0, 1] -> standardised with `mean` and `std`."""
    resize = {"_target_": "torchvision.transforms.v2.Resize", "size": list(size), "antialias": True}
    normalize = {"_target_": "torchvision.transforms.v2.Normalize", "mean": list(mean), "std": list(std)}
    return compose(TO_IMAGE, resize, TO_FLOAT, normalize)
