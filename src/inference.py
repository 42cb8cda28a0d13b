"""From a checkpoint to a model that takes image files: what predict and export share, for every task.

A checkpoint of this template carries everything inference needs in the model's hyperparameters: the net's
config, the class names, and the preprocessing the test images went through (see TaskModule.setup).
A checkpoint inside a run directory also has the run's record beside it, whose config names the
LightningModule class and the data, for predicting on the test split or checking an export on real images.
What a prediction is and how it is written, and what an export's output means, the task module says
(TaskModule.prediction_writer and output_description).
"""

import glob
import importlib
import itertools
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import get_class, instantiate
from lightning import LightningDataModule, LightningModule
from lightning.pytorch.callbacks import BasePredictionWriter
from omegaconf import DictConfig, OmegaConf, open_dict
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from src.data.components.collate import COLLATES
from src.data.components.labels import IMAGE_EXTENSIONS
from src.exporters import PARITY_RULE
from src.models.task_module import PredictInput, PredictionWriter
from src.run.checkpoints import check_checkpoint, load_checkpoint
from src.run.record import RECORD_FILE

log = logging.getLogger(__name__)

DEFAULT_MODULE = "src.models.classifier_module.ClassifierModule"


@dataclass
class Source:
    """A checkpoint, and the config of the run that wrote it (None when it is not inside a run dir)."""

    checkpoint: Path
    run_config: dict[str, Any] | None


def locate(cfg: DictConfig) -> Source:
    """The checkpoint named by `ckpt_path`, or the best (else last) checkpoint of `run_dir`."""
    ckpt_path, run_dir = cfg.get("ckpt_path"), cfg.get("run_dir")
    if ckpt_path is None and run_dir is None:
        raise ValueError(
            f"{cfg.task_name} needs a checkpoint: ckpt_path=<file.ckpt> or run_dir=logs/train/runs/<run>"
        )
    if ckpt_path is None:
        run_dir = Path(run_dir)
        found = [run_dir / "checkpoints" / name for name in ("best.ckpt", "last.ckpt")]
        ckpt_path = next((path for path in found if path.is_file()), None)
        if ckpt_path is None:
            raise FileNotFoundError(
                f"run_dir={run_dir} has no checkpoints/best.ckpt or checkpoints/last.ckpt"
            )
    checkpoint = check_checkpoint(str(ckpt_path))
    run_dir = Path(run_dir) if run_dir is not None else checkpoint.parent.parent
    record = run_dir / RECORD_FILE
    run_config = json.loads(record.read_text()).get("config") if record.is_file() else None
    return Source(checkpoint=checkpoint, run_config=run_config)


def command_line() -> list[str]:
    """This run's command-line overrides (none outside a Hydra run)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def chosen_groups(overrides: list[str]) -> set[str]:
    """The config groups a command line chooses an option of: `data=digits` chooses data, `model/net=mlp`
    chooses model, and `experiment=...` chooses both (an experiment composes its own)."""
    chosen = set()
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if "." not in key:  # a group choice, not a single key
            chosen |= {"data", "model"} if key == "experiment" else {key.split("/")[0]}
    return chosen


def with_keys_set(config: Any, overrides: list[str], group: str) -> DictConfig:
    """`config` with the single keys of `group` that a command line sets or deletes (`data.batch_size=256`,
    `+data.extra=1`, `~data.augment`) applied to it."""
    config = OmegaConf.create(config)
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group.removeprefix(f"{group}.")
        if key == override.key_or_group:
            continue  # not a key of this group
        if override.is_delete():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(config, parent) if parent else config
            if isinstance(node, DictConfig) and leaf in node:
                del node[leaf]
        else:
            OmegaConf.update(config, key, override.value(), force_add=True)
    return config


def group_config(cfg: DictConfig, source: Source, group: str) -> DictConfig | None:
    """The config of `group` (data, model) for this run: the composed one when the command line chose an option
    of it (`data=digits`, `model/net=mlp`, `experiment=...`) or the checkpoint's run does not say, else the
    training run's, with the keys the command line set on top (`data.batch_size=256`); None when neither
    says. A task whose config has no option of `group` (predict's `data: null`) gives its keys the same way."""
    given = cfg.get(group)
    composed = given is not None and "_target_" in given
    trained = (source.run_config or {}).get(group)
    overrides = command_line()
    if trained is None or group in chosen_groups(overrides):
        return given if composed else None
    return with_keys_set(trained, overrides, group) if composed else OmegaConf.merge(trained, given or {})


def with_run_precision(cfg: DictConfig, source: Source) -> DictConfig:
    """`cfg` with its training run's `trainer.precision` unless the command line chooses one (`trainer=`,
    `trainer.precision=`, `experiment=`), for eval: a run trained in bf16 is tested in bf16, so its test
    metrics come out the same. A float16 run (CUDA only) on a machine without CUDA runs in 32, saying so.
    (Predict keeps its own precision, 32: in bf16 an image's prediction would depend on its batch.)"""
    trained = OmegaConf.select(OmegaConf.create(source.run_config or {}), "trainer.precision")
    overrides = command_line()
    keys = {override.key_or_group for override in OverridesParser.create().parse_overrides(overrides)}
    if trained is None or cfg.get("trainer") is None or keys & {"trainer", "trainer.precision", "experiment"}:
        return cfg
    if str(trained).startswith("16") and not torch.cuda.is_available():
        log.info(
            f"{source.checkpoint} was trained with trainer.precision={trained}, which needs CUDA: using 32"
        )
        trained = 32
    with open_dict(cfg):
        cfg.trainer.precision = trained
    return cfg


def with_run_config(cfg: DictConfig, source: Source, groups: tuple[str, ...]) -> DictConfig:
    """`cfg` with the configs of `groups` as `group_config` finds them, so that a run is evaluated as it was
    trained; an error naming what to choose when neither the checkpoint's run nor the command line says."""
    configs = {group: group_config(cfg, source, group) for group in groups}
    unknown = [group for group, config in configs.items() if config is None]
    if unknown:
        raise ValueError(
            f"{source.checkpoint} is not inside a run dir whose run.json names its {' and '.join(unknown)}; "
            f"choose {' and '.join(f'{group}=<option>' for group in unknown)} (with the same model/net=, "
            "experiment= ... as its training run), or give run_dir=logs/train/runs/<run>"
        )
    with open_dict(cfg):
        for group, config in configs.items():
            cfg[group] = config
    return cfg


def load_model(source: Source, module: str | None = None) -> LightningModule:
    """The trained LightningModule in eval mode, on the CPU, without torch.compile."""
    # The run dir's record says which class trained it; `module` is for a checkpoint outside a run dir.
    target = ((source.run_config or {}).get("model") or {}).get("_target_") or module or DEFAULT_MODULE
    cls = get_class(target)
    hparams = load_checkpoint(source.checkpoint).get("hyper_parameters") or {}
    trained_on = data_task((hparams.get("preprocessing") or {}).get("datamodule"))
    if trained_on and getattr(cls, "task", "any") not in (trained_on, "any"):
        raise ValueError(
            f"{source.checkpoint} was trained on {trained_on} data but module={target} is a {cls.task} module; "
            "give module=<the LightningModule class it was trained with>, or run_dir=<its training run>"
        )
    overrides = {"compile": False} if "compile" in hparams else {}  # eager, whatever training used
    model = cls.load_from_checkpoint(source.checkpoint, map_location="cpu", weights_only=True, **overrides)
    if not model.hparams.get("preprocessing"):
        raise ValueError(
            f"{source.checkpoint} does not say how its inputs were preprocessed (hyper_parameters.preprocessing); "
            "it was saved by an older version of this template: retrain, or evaluate it with eval.py"
        )
    return model.eval()


def data_task(datamodule: str | None) -> str | None:
    """The task of the datamodule class a checkpoint names (its `task`: classification, segmentation); None
    when it names none, does not say, or cannot be imported here (predicting on files needs no data code)."""
    if not datamodule:
        return None
    module_name, _, class_name = datamodule.rpartition(".")
    try:
        return getattr(getattr(importlib.import_module(module_name), class_name), "task", None)
    except (ImportError, AttributeError, ValueError):  # ValueError: a name without a module
        return None


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


def file_loader(files: list[Path], preprocessing: dict[str, Any], batch_size: int) -> DataLoader:
    """Batches of image files, preprocessed as the checkpoint's datamodule says; refused when it does not say."""
    if preprocessing.get("transform") is None:
        owner = preprocessing.get("datamodule", "the training datamodule")
        raise ValueError(
            f"{owner} does not say how an image file becomes the net's input; implement "
            f"inference_preprocessing() in it (see ClassificationDataModule.inference_preprocessing) and "
            "retrain, or leave out inputs= to use the run's test split"
        )
    collate = COLLATES[preprocessing.get("collate", "stack")]
    return DataLoader(
        ImageFiles(files, preprocessing), batch_size=batch_size, shuffle=False, collate_fn=collate
    )


@dataclass
class Inputs:
    """What predict runs the model on, and what export checks its artifact with: image files (`inputs=`),
    else the test split of a datamodule (`data=`, else the training run's data)."""

    loader: DataLoader
    files: list[Path] | None = None  # the image files, in the loader's order
    datamodule: LightningDataModule | None = None  # the test split's, when no files were given

    def each(self) -> Iterator[PredictInput]:
        """Each input in the loader's order, for the task's PredictionWriter: its file, or on a test split its
        image and target (label, mask)."""
        if self.files is not None:
            return (PredictInput(index=i, file=file) for i, file in enumerate(self.files))
        test = self.datamodule.data_test
        return (
            PredictInput(index=i, image=image, target=target) for i, (image, target, *_) in enumerate(test)
        )

    def first(self, count: int) -> torch.Tensor:
        """The first `count` images (fewer if there are fewer), as one batch."""
        images: list[torch.Tensor] = []
        for batch in self.loader:
            images.append(batch[0] if isinstance(batch, list | tuple) else batch)
            if sum(len(chunk) for chunk in images) >= count:
                break
        return torch.cat(images)[:count]


def inputs(cfg: DictConfig, source: Source, model: LightningModule, batch_size: int) -> Inputs:
    """The images of `cfg.inputs` (files, folders, globs), else the test split of `cfg.data` or, when that is
    null, of the data the checkpoint's run trained on."""
    if cfg.get("inputs") is not None:
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
    return Inputs(loader=datamodule.predict_dataloader(), datamodule=datamodule)


class ToWriter(BasePredictionWriter):
    """Hands each batch of predictions, as it comes, to the task's PredictionWriter with the inputs it is for:
    predict holds one batch at a time (a segmentation test split's probability maps need not fit in memory)."""

    def __init__(self, writer: PredictionWriter, inputs: Iterator[PredictInput]) -> None:
        super().__init__(write_interval="batch")
        self.writer, self.inputs = writer, inputs

    def write_on_batch_end(
        self,
        trainer,
        pl_module,
        prediction: Any,
        batch_indices,
        batch,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        # The loader does not shuffle: its batches come in the order of `inputs`.
        self.writer.add(prediction.cpu(), list(itertools.islice(self.inputs, len(prediction))))


def write_sidecar(
    artifact: Path, model: LightningModule, fmt: str, max_diff: float, tolerance: float, checkpoint: Path
) -> Path:
    """<artifact>.json: what the artifact expects and gives, and how it was checked."""
    preprocessing = model.hparams.preprocessing
    sidecar = artifact.with_name(artifact.name + ".json")
    if preprocessing.get("transform") is None:
        log.warning(
            f"{sidecar.name}: the input preprocessing is null, since {preprocessing.get('datamodule')} does not "
            "say how an image file becomes the net's input; feed the artifact what its test split gives"
        )
    sidecar.write_text(
        json.dumps(
            {
                "format": fmt,
                "checkpoint": str(checkpoint),
                "input": {  # image_mode and preprocessing are null when the datamodule did not say
                    "shape": ["batch", *(preprocessing.get("input_shape") or [])],
                    "dtype": "float32",
                    "image_mode": preprocessing.get("image_mode"),
                    "preprocessing": preprocessing.get("transform"),
                },
                "output": model.output_description(),
                "class_names": model.label_names(),
                "net": model.hparams.net,
                "parity": {"max_diff": max_diff, "tolerance": tolerance, "rule": PARITY_RULE},
            },
            indent=1,
        )
        + "\n"
    )
    return sidecar
