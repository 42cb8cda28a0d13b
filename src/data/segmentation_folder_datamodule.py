"""Your own segmentation data: a folder of images and a folder of masks (`data=segmentation_folder`).

A mask is a PNG of class indices with its image's relative path and stem (`images/a/cat.jpg` ->
`masks/a/cat.png`). Every image and mask is checked before training (components/file_check.py): a missing,
unreadable, colour, wrongly sized mask or one with a value that is no class fails the run in one line that
names the file. The transforms are applied to the image and its mask together, so that crops, flips and
resizes keep them aligned (torchvision's transforms v2 resize a `tv_tensors.Mask` by nearest neighbour).
"""

import io  # [part: streaming]
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from PIL import Image
from torch.utils.data import Dataset
from torchvision import tv_tensors

from src.common.classes import names_or_indices
from src.data.components.file_check import BadFileError, check_files, decode, raise_first
from src.data.components.image_dataset import UNREADABLE, default_transform_config
from src.data.components.images import IMAGE_EXTENSIONS
from src.data.components.preprocessing import follow_the_weights
from src.data.datamodule import seeded_split
from src.data.segmentation_datamodule import SegmentationDataModule

STAGES = ("train", "val", "test")
# PIL modes of a mask that hold one value per pixel: 8-, 32- and 16-bit integers, 1-bit, palette indices.
MASK_MODES = ("L", "I", "I;16", "1", "P")


def mask_tensor(mask: Image.Image) -> torch.Tensor:
    """A mask's class indices as an (H, W) tensor: uint8 for 8-bit and palette PNGs (the module makes each
    batch long), int64 for 16- and 32-bit ones."""
    values = np.array(mask)
    return torch.from_numpy(values.astype(np.uint8 if values.dtype in (np.bool_, np.uint8) else np.int64))


class SegmentationFolderDataset(Dataset):
    """(image path, mask path) pairs; an item is `(image (C, H, W) float, mask (H, W) of class indices)`, both
    through the one `transform`. `mode`: the PIL mode every image is converted to ("RGB", "L")."""

    def __init__(self, pairs: Sequence[tuple[Path, Path]], transform: Callable[..., Any], mode: str) -> None:
        self.pairs = list(pairs)
        self.transform = transform
        self.mode = mode

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image_path, mask_path = self.pairs[index]
        try:
            image, mask = self.decode(image_path, mask_path)
        except UNREADABLE as err:  # they were checked at start-up: changed since?
            raise RuntimeError(
                f"cannot read {image_path} or its mask {mask_path} ({err}); did it change since training "
                "started?"
            ) from err
        return self.transformed(image, mask)

    def decode(self, image_file: Path | IO[bytes], mask_file: Path | IO[bytes]) -> tuple[Image.Image, Any]:
        """An image in `mode` and its mask (a tv_tensors.Mask), from their files or the files' bytes."""
        with Image.open(image_file) as file:
            image = file.convert(self.mode)
        with Image.open(mask_file) as file:
            return image, tv_tensors.Mask(mask_tensor(file))

    # part: streaming
    def to_shard(self, index: int) -> dict[str, Any]:
        """Pair `index` as shards store it (src/shard.py): the image's and the mask's file bytes, and the image's
        path (as bytes, as ImageDataset.to_shard says)."""
        image_path, mask_path = self.pairs[index]
        files = {"image": image_path.read_bytes(), "mask": mask_path.read_bytes()}
        return files | {"file": str(image_path).encode()}

    def from_shard(self, sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """A stored pair (data=streaming) as the item its files give."""
        try:
            image, mask = self.decode(io.BytesIO(sample["image"]), io.BytesIO(sample["mask"]))
        except UNREADABLE as err:
            raise RuntimeError(
                f"the shards hold an unreadable copy of {bytes(sample['file']).decode()} or its mask ({err}); "
                "write them again with src/shard.py"
            ) from err
        return self.transformed(image, mask)

    # /part

    def transformed(self, image: Image.Image, mask: Any) -> tuple[torch.Tensor, torch.Tensor]:
        image, mask = self.transform(image, mask)
        if not isinstance(image, torch.Tensor):
            raise TypeError(
                "data.transforms must turn the image into a tensor: start each with "
                "torchvision.transforms.v2.ToImage"
            )
        return image.as_subclass(torch.Tensor), mask.as_subclass(torch.Tensor)


class SegmentationFolderDataModule(SegmentationDataModule):
    """Images in `image_dir` (any depth; hidden files skipped), their masks in `mask_dir`; train/val/test
    drawn from them by `split` with `split_seed`. Every argument is documented in
    configs/data/segmentation_folder.yaml; `settings` are the DataModule's (augment, batch_size,
    num_workers, ...; see there).
    """

    name = "segmentation folder"

    @classmethod
    def complete_config(cls, cfg: DictConfig) -> None:
        """`mean`, `std`, `interpolation` and `input_shape` left null follow the net's pretrained weights."""
        follow_the_weights(cfg)

    def __init__(
        self,
        image_dir: str,
        mask_dir: str,
        num_classes: int,
        input_shape: Sequence[int],
        ignore_index: int = 255,
        class_names: Sequence[str] | None = None,
        split: Sequence[int | float] = (0.8, 0.1, 0.1),
        split_seed: int = 42,
        image_mode: str = "RGB",
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        transforms: dict[str, Any] | None = None,
        check_cache: str | None = None,
        **settings: Any,
    ) -> None:
        unknown = set(transforms or {}) - set(STAGES)
        if unknown:
            raise ValueError(f"data.transforms has {sorted(unknown)}; its keys are {', '.join(STAGES)}")
        if len(split) != 3:
            raise ValueError(f"data.split={list(split)} needs 3 entries: the train, val and test shares")
        super().__init__(
            num_classes=num_classes,
            input_shape=input_shape,
            ignore_index=ignore_index,
            class_names=class_names,
            split=split,
            split_seed=split_seed,
            **settings,
        )
        if class_names is None:  # the hyperparameters hold the arguments as given: name the classes there
            self.hparams.class_names = names_or_indices(None, num_classes)

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        pairs = self.pairs()
        self.check_files(pairs)
        drawn = seeded_split(pairs, self.hparams.split, self.hparams.split_seed, self.name)
        return tuple(
            SegmentationFolderDataset(
                [pairs[i] for i in subset.indices],
                instantiate(self._transform_config(stage)),
                self.hparams.image_mode,
            )
            for stage, subset in zip(STAGES, drawn, strict=True)
        )

    def fold_pool(
        self, train: SegmentationFolderDataset, val: SegmentationFolderDataset
    ) -> tuple[SegmentationFolderDataset, SegmentationFolderDataset]:
        """The train+val pairs twice: through the training transforms (the training folds) and through the
        validation ones (the validation fold), so the validation fold is not augmented."""
        pairs = train.pairs + val.pairs
        return (
            SegmentationFolderDataset(pairs, train.transform, train.mode),
            SegmentationFolderDataset(pairs, val.transform, val.mode),
        )

    def pairs(self) -> list[tuple[Path, Path]]:
        """Every image below `image_dir` (sorted) with the path its mask must have."""
        image_dir, mask_dir = Path(self.hparams.image_dir), Path(self.hparams.mask_dir)
        for key, folder, what in (
            ("image_dir", image_dir, "the folder of your images"),
            (
                "mask_dir",
                mask_dir,
                "the folder of their masks: one PNG of class indices per image, named like it",
            ),
        ):
            if not folder.is_dir():
                raise FileNotFoundError(f"data.{key}={folder} does not exist; give {what}")
        if image_dir.resolve() == mask_dir.resolve():
            raise ValueError(
                f"data.mask_dir={mask_dir} is data.image_dir; keep the masks in a folder of their own"
            )
        images = sorted(
            path
            for path in image_dir.rglob("*")
            if path.suffix.lower() in IMAGE_EXTENSIONS
            and not path.name.startswith(".")
            and not path.is_relative_to(mask_dir)  # a mask folder inside the image folder holds no images
            and path.is_file()
        )
        if not images:
            raise ValueError(
                f"data.image_dir={image_dir} holds no images ({', '.join(IMAGE_EXTENSIONS)}); give the "
                "folder of your images"
            )
        return [(path, mask_dir / path.relative_to(image_dir).with_suffix(".png")) for path in images]

    def check_files(self, pairs: list[tuple[Path, Path]]) -> None:
        """Every image and mask checked once (unchanged ones skipped by `check_cache`): every rank checks, so
        each fails alike without waiting on another; the first rank of each node writes the cache."""
        hp = self.hparams
        failures = check_files(
            pairs,
            self._check_pair,
            self.name,
            "image/mask pairs",
            hp.check_cache,
            {
                "image_dir": str(Path(hp.image_dir).absolute()),
                "mask_dir": str(Path(hp.mask_dir).absolute()),
                "num_classes": hp.num_classes,
                "ignore_index": hp.ignore_index,
            },
            workers=hp.num_workers,
            write_cache=self.trainer is None or self.trainer.local_rank == 0,
        )
        raise_first(failures)

    def _check_pair(self, pair: tuple[Path, Path]) -> None:
        image_path, mask_path = pair
        image = decode(image_path, "image", "replace it, or remove it and its mask")
        if not mask_path.is_file():
            raise BadFileError(
                f"image {image_path} has no mask: expected {mask_path} (a PNG of class indices with the "
                "image's name, in data.mask_dir); add it or remove the image"
            )
        mask = decode(mask_path, "mask", "replace it with a PNG of class indices")
        if mask.mode not in MASK_MODES:
            raise BadFileError(
                f"mask {mask_path} has {len(mask.getbands())} channel(s) (PIL mode {mask.mode}); a mask "
                "holds one class index per pixel: save it single-channel (mode L or I) or as a palette PNG "
                "(mode P)"
            )
        if mask.size != image.size:
            raise BadFileError(
                f"mask {mask_path} is {mask.width}x{mask.height} pixels but its image {image_path} is "
                f"{image.width}x{image.height}; a mask must have its image's size"
            )
        try:
            self.check_mask(mask_tensor(mask), str(mask_path))
        except ValueError as err:
            raise BadFileError(str(err)) from err

    # part: streaming
    def shard_decoder(self, stage: str) -> Callable[[dict[str, Any]], tuple[torch.Tensor, torch.Tensor]]:
        """How data=streaming makes `stage`'s item of a pair that shards store from these files
        (SegmentationFolderDataset.to_shard): with that stage's transforms and colour mode."""
        transform = instantiate(self._transform_config(stage))
        return SegmentationFolderDataset([], transform, self.hparams.image_mode).from_shard

    # /part
    # part: predict
    def inference_preprocessing(self) -> dict[str, Any]:
        """What the test images go through: their transforms config (test's, else val's; it takes an image
        alone as well as an image and mask) and colour mode."""
        return {
            "image_mode": self.hparams.image_mode,
            "input_shape": list(self.hparams.input_shape),
            "transform": self._transform_config("test"),
        }

    # /part

    def _transform_config(self, stage: str) -> dict[str, Any]:
        """The transforms config of `stage`: test falls back to val's, train is test's when `augment` is off,
        and a stage without any gets ToImage and ToDtype."""
        if stage == "train" and not self.hparams.augment:
            return self._transform_config("test")
        configs = self.hparams.transforms or {}
        config = configs.get(stage) or (configs.get("val") if stage == "test" else None)
        return config or default_transform_config()
