"""A Dataset of image files with labels: decoded with PIL, transformed by torchvision's transforms v2."""

import io  # [part: streaming]
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import torch
from hydra.utils import instantiate
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms import v2

from src.data.components.images import TO_FLOAT, TO_IMAGE, compose

# What PIL raises for a file that is not an image, is truncated, or is too large to be safe.
UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def default_transform_config() -> dict[str, Any]:
    """What a stage without configured transforms gets: TO_IMAGE, then TO_FLOAT."""
    return compose(TO_IMAGE, TO_FLOAT)


def default_transform() -> v2.Transform:
    return instantiate(default_transform_config())


class ImageDataset(Dataset):
    """(path, label) pairs; an item is `(transform(image), label)`.

    `mode` is PIL's colour mode every image is converted to ("RGB", "L" for grayscale), so a folder that
    mixes grayscale and colour files still gives tensors of one shape. An unreadable file raises an error
    naming it (the file check at set-up finds such files before training: components/file_check.py).
    """

    def __init__(
        self,
        samples: Sequence[tuple[Path, int]],
        transform: Callable[[Image.Image], torch.Tensor] | None = None,
        mode: str = "RGB",
    ) -> None:
        self.samples = list(samples)
        self.transform = transform or default_transform()
        self.mode = mode

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def targets(self) -> list[int]:
        """Every sample's label, without opening an image (torchvision datasets' name for them)."""
        return [label for _, label in self.samples]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        try:
            image = self.decode(path)
        except UNREADABLE as err:
            raise RuntimeError(
                f"cannot read image {path} ({err}); replace or remove it, or set data.skip_corrupt=true "
                "to skip unreadable images"
            ) from err
        return self.transform(image), label

    def decode(self, file: Path | IO[bytes]) -> Image.Image:
        """An image file (or its bytes), decoded whole (a truncated one fails here) and converted to `mode`."""
        with Image.open(file) as image:
            return image.convert(self.mode)

    # part: streaming
    def to_shard(self, index: int) -> dict[str, Any]:
        """Sample `index` as shards store it (src/shard.py): the image file's bytes, its label and its path (as
        bytes: litdata would store a string that names an image file as that image, decoded)."""
        path, label = self.samples[index]
        return {"image": Path(path).read_bytes(), "label": label, "file": str(path).encode()}

    def from_shard(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        """A stored sample (data=streaming) as the item its file gives: decoded, then transformed."""
        try:
            image = self.decode(io.BytesIO(sample["image"]))
        except UNREADABLE as err:
            raise RuntimeError(
                f"the shards hold an unreadable copy of {bytes(sample['file']).decode()} ({err}); write them "
                "again with src/shard.py"
            ) from err
        return self.transform(image), int(sample["label"])

    # /part
