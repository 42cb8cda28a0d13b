"""What predict runs a model on, and what export checks its artifact with: image files (`inputs=`: files,
folders, globs), preprocessed as the checkpoint says its test images were, else a datamodule's test split."""

import glob
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_object, instantiate
from lightning import LightningDataModule, LightningModule
from omegaconf import DictConfig
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from src.data.components.images import IMAGE_EXTENSIONS
from src.inference.predictions import PredictInput
from src.run.trained_run import TrainedRun, group_config


def image_transform(preprocessing: dict[str, Any]) -> Any:
    return instantiate(preprocessing["transform"])


def expand_inputs(inputs: Any) -> list[Path]:
    """Image files from a file, a folder (searched recursively) or a glob, or a list of those; sorted."""
    files: list[Path] = []
    for item in [inputs] if isinstance(inputs, str) else list(inputs):
        path = Path(str(item)).expanduser()
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
        elif path.is_file():
            files.append(path)
        elif matches := sorted(Path(p) for p in glob.glob(str(path), recursive=True)):
            files += [p for p in matches if p.suffix.lower() in IMAGE_EXTENSIONS]
        else:
            raise FileNotFoundError(f"inputs: {item} is not a file, a folder or a pattern that matches files")
    if not files:
        raise ValueError(f"inputs={inputs} holds no image files ({', '.join(IMAGE_EXTENSIONS)})")
    return files


class ImageFiles(Dataset):
    """Image files as the net's inputs, preprocessed as the training test set was."""

    def __init__(self, files: list[Path], preprocessing: dict[str, Any]) -> None:
        self.files = files
        self.mode = preprocessing["image_mode"]
        self.transform = image_transform(preprocessing)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        try:
            with Image.open(self.files[index]) as file:
                image = file.convert(self.mode)
        except OSError as err:
            raise RuntimeError(f"cannot read image {self.files[index]} ({err})") from err
        return self.transform(image), -1  # -1: no label


def require_file_preprocessing(preprocessing: dict[str, Any] | None, instead: str) -> None:
    """Refuse image files when the checkpoint's datamodule does not say how one becomes the net's input;
    `instead` says what the user can do without them."""
    preprocessing = preprocessing or {}
    if preprocessing.get("transform") is None:
        owner = preprocessing.get(
            "datamodule", "the datamodule of a checkpoint that records no preprocessing"
        )
        raise ValueError(
            f"{owner} does not say how an image file becomes the net's input; implement "
            f"inference_preprocessing() in it (see DataModule.inference_preprocessing) and "
            f"retrain, or {instead}"
        )


def file_loader(files: list[Path], preprocessing: dict[str, Any] | None, batch_size: int) -> DataLoader:
    """Batches of image files, preprocessed as the checkpoint's datamodule says; refused when it does not say."""
    require_file_preprocessing(preprocessing, "leave out inputs= to use the run's test split")
    collate = get_object(preprocessing["collate"]) if preprocessing.get("collate") else None
    return DataLoader(ImageFiles(files, preprocessing), batch_size=batch_size, collate_fn=collate)


@dataclass
class Inputs:
    """What predict runs the model on, and what export checks its artifact with: image files (`inputs=`),
    else the test split of a datamodule (`data=`, else the training run's data)."""

    loader: DataLoader
    files: list[Path] | None = None  # the image files, in the loader's order
    datamodule: LightningDataModule | None = None  # the test split's, when no files were given
    texts: list[str] | None = None  # a text classifier's inputs=, in the loader's order  [part: text]

    def each(self) -> Iterator[PredictInput]:
        """Each input in the loader's order, for the task's PredictionWriter: its file, or on a test split its
        image and target (label, mask)."""
        if self.files is not None:
            return (PredictInput(index=i, file=file) for i, file in enumerate(self.files))
        if self.texts is not None:  # [part: text]
            return (PredictInput(index=i, text=text) for i, text in enumerate(self.texts))  # [part: text]
        test = self.datamodule.data_test
        return (
            PredictInput(index=i, image=image, target=target) for i, (image, target, *_) in enumerate(test)
        )

    def first(self, count: int) -> Any:
        """The first `count` inputs (fewer if there are fewer) as one batch of what the net takes: images,
        or a text's padded token ids and attention mask."""
        loader = DataLoader(self.loader.dataset, batch_size=count, collate_fn=self.loader.collate_fn)
        batch = next(iter(loader))
        return batch[0] if isinstance(batch, list | tuple) else batch


def inputs(cfg: DictConfig, source: TrainedRun, model: LightningModule, batch_size: int) -> Inputs:
    """The images of `cfg.inputs` (files, folders, globs), else the test split of `cfg.data` or, when that is
    null, of the data the checkpoint's run trained on."""
    if cfg.get("inputs") is not None:
        # part: text
        preprocessing = model.hparams.get("preprocessing") or {}
        if preprocessing.get("kind") == "text":  # a text classifier's: texts, not images
            from src.inference.text_inputs import read_texts, text_loader

            texts = read_texts(cfg.inputs, preprocessing["text_column"])
            return Inputs(loader=text_loader(texts, preprocessing, batch_size), texts=texts)
        # /part
        files = expand_inputs(cfg.inputs)
        return Inputs(loader=file_loader(files, model.hparams.preprocessing, batch_size), files=files)
    config = group_config(cfg, source, "data")
    if config is None:
        raise ValueError(
            f"{cfg.task_name} needs images: give inputs=<image files, a folder or a glob>, or +data=<option> "
            f"({source.checkpoint} is not inside a run dir whose config names its data)"
        )
    datamodule = instantiate(config, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("test")
    return Inputs(loader=datamodule.test_dataloader(), datamodule=datamodule)
