"""The run a checkpoint came from: which checkpoint (`ckpt_path`, or the best of `run_dir`), and the data,
model and precision it was trained with, which eval, predict and export use unless the command line chooses
others. A checkpoint inside a run directory has the run's record (run.json) beside it, whose config names the
LightningModule class and the data."""

import importlib  # [part: predict]
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import get_class  # [part: predict]
from lightning import LightningModule  # [part: predict]
from omegaconf import DictConfig, OmegaConf, open_dict

from src.run.checkpoints import (
    check_checkpoint,
    load_checkpoint,  # [part: predict]
)
from src.run.record import RECORD_FILE

log = logging.getLogger(__name__)


@dataclass
class TrainedRun:
    """A checkpoint, and the config of the run that wrote it (None when it is not inside a run dir)."""

    checkpoint: Path
    run_config: dict[str, Any] | None


def locate(cfg: DictConfig) -> TrainedRun:
    """The checkpoint named by `ckpt_path`, or the one of `run_dir` that its test after training used (its
    run.json's `tested_checkpoint`), else its best, else its last."""
    ckpt_path, run_dir = cfg.get("ckpt_path"), cfg.get("run_dir")
    if ckpt_path is None and run_dir is None:
        raise ValueError(
            f"{cfg.task_name} needs a checkpoint: ckpt_path=<file.ckpt> or run_dir=logs/train/runs/<run>"
        )
    record = read_record(Path(run_dir)) if run_dir else None
    if ckpt_path is None:
        tested = record.get("tested_checkpoint") if record else None
        names = [tested] if tested and not Path(tested).is_absolute() else []
        found = [Path(run_dir) / name for name in (*names, "checkpoints/best.ckpt", "checkpoints/last.ckpt")]
        ckpt_path = next((path for path in found if path.is_file()), None)
        if ckpt_path is None:
            raise FileNotFoundError(
                f"run_dir={run_dir} has no checkpoints/best.ckpt or checkpoints/last.ckpt"
            )
    checkpoint = check_checkpoint(str(ckpt_path))
    record = record if run_dir else read_record(checkpoint.parent.parent)
    return TrainedRun(checkpoint=checkpoint, run_config=record.get("config") if record else None)


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """A run dir's run.json, or None when it has none."""
    record = run_dir / RECORD_FILE
    return json.loads(record.read_text()) if record.is_file() else None


def command_line() -> list[str]:
    """This run's command-line overrides (none outside a Hydra run)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def override_keys(overrides: list[str]) -> set[str]:
    """The keys and groups a command line sets: `data=digits` gives data, `data.batch_size=256` data.batch_size."""
    return {override.key_or_group for override in OverridesParser.create().parse_overrides(overrides)}


def chosen_groups(overrides: list[str]) -> set[str]:
    """The config groups a command line chooses an option of: `data=digits` chooses data, `model/net=mlp`
    chooses model, and `experiment=...` chooses both (an experiment composes its own)."""
    groups = {key.split("/")[0] for key in override_keys(overrides) if "." not in key}
    return groups | ({"data", "model"} if "experiment" in groups else set())


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
            node = OmegaConf.select(config, parent)
            if isinstance(node, DictConfig):
                node.pop(leaf, None)
        else:
            OmegaConf.update(config, key, override.value(), force_add=True)
    return config


def group_config(cfg: DictConfig, source: TrainedRun, group: str) -> DictConfig | None:
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


def with_run_precision(cfg: DictConfig, source: TrainedRun) -> DictConfig:
    """`cfg` with its training run's `trainer.precision` unless the command line chooses one (`trainer=`,
    `trainer.precision=`, `experiment=`), for eval: a run trained in bf16 is tested in bf16, so its test
    metrics come out the same. A float16 run (CUDA only) on a machine without CUDA runs in 32, saying so.
    (Predict keeps its own precision, 32: in bf16 an image's prediction would depend on its batch.)"""
    trained = ((source.run_config or {}).get("trainer") or {}).get("precision")
    chosen = override_keys(command_line()) & {"trainer", "trainer.precision", "experiment"}
    if trained is None or cfg.get("trainer") is None or chosen:
        return cfg
    if str(trained).startswith("16") and not torch.cuda.is_available():
        log.info(
            f"{source.checkpoint} was trained with trainer.precision={trained}, which needs CUDA: using 32"
        )
        trained = 32
    with open_dict(cfg):
        cfg.trainer.precision = trained
    return cfg


def with_run_config(cfg: DictConfig, source: TrainedRun, groups: tuple[str, ...]) -> DictConfig:
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


# part: predict
DEFAULT_MODULE = "src.models.classifier_module.ClassifierModule"


def load_model(source: TrainedRun, module: str | None = None) -> LightningModule:
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


# /part
