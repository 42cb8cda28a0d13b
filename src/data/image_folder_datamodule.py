"""Your own images: a folder of image files plus a label file, or one folder per class (`data=image_folder`).

Everything is checked before training starts: the label files parse, every class is known, every listed
image exists and decodes (components/file_check.py), no split is empty. The class names (index i =
class_names[i]) are stored in the datamodule's hyperparameters, so every checkpoint carries them, and written
to <run dir>/class_names.json.
"""

import json
import logging
from collections.abc import (
    Callable,  # [part: streaming]
    Sequence,
)
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig
from torch.utils.data import Dataset

from src.data.classification_datamodule import ClassificationDataModule
from src.data.components.collate import COLLATES
from src.data.components.file_check import Files, check_files, decode, raise_first
from src.data.components.image_dataset import (
    ImageDataset,
    default_transform,
    default_transform_config,  # [part: predict]
)
from src.data.components.labels import (
    ClassIndex,
    Sample,
    check_images_exist,
    read_label_file,
    scan_class_folders,
)
from src.data.components.preprocessing import follow_the_weights
from src.data.datamodule import assign_parts

log = logging.getLogger(__name__)

LAYOUTS = ("label_file", "class_folders")
STAGES = ("train", "val", "test")


class ImageFolderDataModule(ClassificationDataModule):
    """Image files with labels from a CSV (`layout=label_file`) or from class folders (`layout=class_folders`).

    Every argument is documented in configs/data/image_folder.yaml. `transforms` holds one transforms-v2
    config per stage, `prepare` a function config (plain data, instantiated here, so checkpoints stay
    loadable with weights_only=True).
    """

    name = "image folder"

    @classmethod
    def complete_config(cls, cfg: DictConfig) -> None:
        """`mean`, `std`, `interpolation` and `input_shape` left null follow the net's pretrained weights."""
        follow_the_weights(cfg)

    def __init__(
        self,
        image_dir: str,
        num_classes: int,
        input_shape: Sequence[int],
        layout: str = "label_file",
        label_file: str | None = None,
        val_label_file: str | None = None,
        test_label_file: str | None = None,
        val_dir: str | None = None,
        test_dir: str | None = None,
        header: bool | str = "auto",
        image_column: int | str = 0,
        label_column: int | str = 1,
        class_names: Sequence[str] | None = None,
        split: Sequence[int | float] = (0.8, 0.1, 0.1),
        split_seed: int = 42,
        num_folds: int | None = None,
        fold: int = 0,
        augment: bool = True,
        image_mode: str = "RGB",
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        interpolation: str | None = None,
        transforms: dict[str, Any] | None = None,
        collate: str = "stack",
        skip_corrupt: bool = False,
        check_cache: str | None = None,
        prepare: dict[str, Any] | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        drop_last: bool = False,
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"data.layout={layout} is not valid; choose {' or '.join(LAYOUTS)}")
        if collate not in COLLATES:
            raise ValueError(f"data.collate={collate} is not valid; choose {' or '.join(COLLATES)}")
        if layout == "label_file" and not label_file:
            raise ValueError("data.layout=label_file needs data.label_file (a CSV of image name, label)")
        other_layout = (
            {"val_dir": val_dir, "test_dir": test_dir}
            if layout == "label_file"
            else {
                "label_file": label_file,
                "val_label_file": val_label_file,
                "test_label_file": test_label_file,
            }
        )
        for key, value in other_layout.items():
            if value:
                raise ValueError(f"data.{key}={value} does not apply to data.layout={layout}; set it to null")
        unknown = set(transforms or {}) - set(STAGES)
        if unknown:
            raise ValueError(f"data.transforms has {sorted(unknown)}; its keys are {', '.join(STAGES)}")
        if len(split) != 3:
            raise ValueError(f"data.split={list(split)} needs 3 entries: the train, val and test shares")
        super().__init__(
            num_classes=num_classes,
            input_shape=input_shape,
            split=split,
            split_seed=split_seed,
            num_folds=num_folds,
            fold=fold,
            augment=augment,
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            drop_last=drop_last,
        )
        self.collate_fn = COLLATES[collate]

    def prepare_data(self) -> None:
        """Call `prepare` (once per node, before any rank reads a file): it downloads or writes the data."""
        if self.hparams.prepare is not None:
            instantiate(self.hparams.prepare)

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        pool = self._listed("train")
        if not pool:
            raise ValueError(f"{self._source()} lists no images; data.image_dir={self.hparams.image_dir}")
        index = ClassIndex.infer(pool, self.hparams.num_classes, self.hparams.class_names)
        separate = {stage: self._listed(stage) for stage in ("val", "test")}
        check_images_exist(pool + [s for samples in separate.values() if samples for s in samples])
        pool, separate = self._readable(pool, separate)
        labelled = {
            stage: [(s.path, index(s)) for s in samples] for stage, samples in separate.items() if samples
        }
        drawn = self._split([(s.path, index(s)) for s in pool], has_own={s for s in separate if separate[s]})
        self.hparams.class_names = index.names  # saved with every checkpoint
        self._write_class_names(index.names)
        return tuple(
            ImageDataset(
                labelled.get(stage, drawn[stage]),
                transform=self._transform(stage),
                mode=self.hparams.image_mode,
            )
            for stage in STAGES
        )

    def fold_pool(self, train: ImageDataset, val: ImageDataset) -> tuple[ImageDataset, ImageDataset]:
        """The train+val images twice: through the training transforms (the training folds) and through the
        validation ones (the validation fold), so the validation fold is not augmented."""
        samples = train.samples + val.samples
        return (
            ImageDataset(samples, train.transform, train.mode),
            ImageDataset(samples, val.transform, val.mode),
        )

    # part: streaming
    def shard_decoder(self, stage: str) -> Callable[[dict[str, Any]], tuple[Any, int]]:
        """How data=streaming makes `stage`'s item of a sample that shards store from these files
        (ImageDataset.to_shard): with that stage's transforms and colour mode, as load_datasets does."""
        return ImageDataset([], transform=self._transform(stage), mode=self.hparams.image_mode).from_shard

    # /part
    # part: predict
    def inference_preprocessing(self) -> dict[str, Any]:
        """What the test images went through: their transforms config (test's, else val's), colour mode and
        batching."""
        collate = COLLATES[self.hparams.collate]
        return {
            "image_mode": self.hparams.image_mode,
            "input_shape": list(self.hparams.input_shape),
            "collate": f"{collate.__module__}.{collate.__name__}",
            "transform": self._transform_config("test") or default_transform_config(),
        }

    # /part

    def _listed(self, stage: str) -> list[Sample] | None:
        """The samples of `stage`'s own source (None when it has none and is drawn from the train pool)."""
        hp = self.hparams
        if hp.layout == "class_folders":
            key = {"train": "image_dir", "val": "val_dir", "test": "test_dir"}[stage]
            return scan_class_folders(hp[key], key) if hp[key] else None
        key = {"train": "label_file", "val": "val_label_file", "test": "test_label_file"}[stage]
        if not hp[key]:
            return None
        return read_label_file(hp[key], hp.image_dir, hp.image_column, hp.label_column, hp.header, key)

    def _readable(
        self, pool: list[Sample], separate: dict[str, list[Sample] | None]
    ) -> tuple[list[Sample], dict[str, list[Sample] | None]]:
        """Every image decoded once (those unchanged since they last passed are skipped: data.check_cache).
        An unreadable one fails the run naming it, or with data.skip_corrupt=true is left out, counted in
        one warning. Every rank checks, so each fails alike; the first rank of each node writes the cache."""
        everything = pool + [sample for samples in separate.values() if samples for sample in samples]
        hint = "replace or remove it, or set data.skip_corrupt=true to skip unreadable images"

        def check(files: Files) -> None:
            decode(files[0], "image", hint)

        failures = check_files(
            [(sample.path,) for sample in everything],
            check,
            self.name,
            "images",
            self.hparams.check_cache,
            {"image_dir": str(Path(self.hparams.image_dir).absolute())},
            workers=self.hparams.num_workers,
            write_cache=self.trainer is None or self.trainer.local_rank == 0,
        )
        if not self.hparams.skip_corrupt:
            raise_first(failures)
        if not failures:
            return pool, separate
        skipped = [files[0] for files in failures]
        names = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        log.warning(
            f"Skipped {len(skipped)} unreadable image(s) of {len(everything)} (data.skip_corrupt=true): {names}"
        )
        bad = set(skipped)
        return [s for s in pool if s.path not in bad], {
            stage: samples and [s for s in samples if s.path not in bad]
            for stage, samples in separate.items()
        }

    def _source(self) -> str:
        """The training source, as the config key that names it."""
        hp = self.hparams
        return (
            f"data.image_dir={hp.image_dir}"
            if hp.layout == "class_folders"
            else f"data.label_file={hp.label_file}"
        )

    def _split(self, pool: list[tuple[Path, int]], has_own: set[str]) -> dict[str, list[tuple[Path, int]]]:
        """Draw train/val/test from the pool by `split` (sizes or fractions), the same on every run and rank,
        stratified by class (`assign_parts`): a small val or test split still holds every class it can.

        A stage with a source of its own must get a share of 0, so that no image is silently left out.
        """
        shares = list(self.hparams.split)
        for i, stage in enumerate(STAGES):
            if stage in has_own and shares[i]:
                fixed = [0 if STAGES[j] in has_own else share for j, share in enumerate(shares)]
                raise ValueError(
                    f"data.split={shares} draws a {stage} share from the training labels, but {stage} has its "
                    f"own {'folder' if self.hparams.layout == 'class_folders' else 'label file'}; give it 0, "
                    f"e.g. data.split={fixed} (the other shares must still fill the pool)"
                )
        total = len(pool)
        if all(isinstance(share, int) for share in shares):
            if sum(shares) != total:
                raise ValueError(f"data.split={shares} must sum to the {total} images of {self._source()}")
            sizes = shares
        else:
            if abs(sum(shares) - 1.0) > 1e-6 or min(shares) < 0:
                raise ValueError(f"data.split={shares}: fractions must be at least 0 and sum to 1.0")
            sizes = [int(share * total) for share in shares]
            sizes[0] += total - sum(sizes)  # rounding leftovers go to train
        parts = assign_parts(sizes, self.hparams.split_seed, labels=[label for _, label in pool]).tolist()
        return {
            stage: [s for s, part in zip(pool, parts, strict=True) if part == i]
            for i, stage in enumerate(STAGES)
        }

    def _transform_config(self, stage: str) -> dict[str, Any] | None:
        """The transforms config of `stage` (test falls back to val's; train is test's when `augment` is off);
        None when it has none."""
        if stage == "train" and not self.hparams.augment:
            return self._transform_config("test")
        configs = self.hparams.transforms or {}
        return configs.get(stage) or (configs.get("val") if stage == "test" else None)

    def _transform(self, stage: str) -> Any:
        config = self._transform_config(stage)
        return default_transform() if config is None else instantiate(config)

    def _check_shapes(self, dataset: Dataset) -> None:
        image = next(item for item in (dataset[i] for i in range(len(dataset))) if item is not None)[0]
        expected = list(self.hparams.input_shape)
        if self.hparams.collate == "pad":  # sizes vary by design; only the channels must match
            if image.shape[0] != expected[0]:
                raise ValueError(
                    f"data.input_shape={expected} has {expected[0]} channels but the images have "
                    f"{image.shape[0]} (data.image_mode={self.hparams.image_mode}); make them agree"
                )
        elif list(image.shape) != expected:
            raise ValueError(
                f"data.input_shape={expected} but the transformed training images have shape "
                f"{list(image.shape)}; resize them in data.transforms or fix data.input_shape"
            )

    def _write_class_names(self, names: list[str]) -> None:
        trainer = self.trainer
        if trainer is None or not trainer.is_global_zero:
            return
        path = Path(trainer.default_root_dir) / "class_names.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(names, indent=1) + "\n")
        log.info(f"{len(names)} classes (index i = class_names[i]) written to {path}")
