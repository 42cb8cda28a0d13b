"""Checks on the trainer and launch settings, run before anything is instantiated.

A combination that cannot work fails here in a second, with one line naming the key to change, instead of
minutes later deep inside Lightning, or not at all (Lightning silently swaps 16-mixed for bf16-mixed on the CPU).
"""

import inspect
import os
import types
import typing
from typing import Any, get_args

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf

from src.common import config_names
from src.launch import environment


def _arms(hint: Any) -> list[Any]:
    """The types a type hint allows, with its unions flattened (`int | Literal["a"] | None`: three arms)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [arm for part in get_args(hint) for arm in _arms(part)]
    return [hint]


def check_run(cfg: DictConfig) -> None:
    """Refuse a run whose settings or launch cannot work; each error names what to change."""
    check_launch()
    if (
        cfg.get("run_name") is not None
        and HydraConfig.initialized()
        and HydraConfig.get().mode == RunMode.MULTIRUN
    ):
        raise ValueError(
            f"run_name={cfg.run_name} names one run, but this is a sweep (-m), whose jobs go to numbered "
            "directories; drop run_name"
        )
    for key, target in (("trainer", "lightning.pytorch.Trainer"), ("data", None)):
        if cfg.get(key) is not None:
            check_types(cfg[key], key, target)  # an unknown precision: "expected one of 32, 16-mixed, ..."
    if "trainer" in cfg:
        check_trainer(cfg.trainer)
    check_values(cfg)
    check_components(cfg)  # [part: pretrained]


# part: pretrained
def check_components(cfg: DictConfig) -> None:
    """The checks that the model's class and each callback's keep for themselves: a class named by a config's
    `_target_` may have a class method `check_config(cfg, key)` that refuses what cannot work with the rest of the
    run (callbacks.lr_finder under DDP), before anything is instantiated."""
    components = {"model": cfg.get("model")} | {
        f"callbacks.{name}": conf for name, conf in (cfg.get("callbacks") or {}).items()
    }
    for key, conf in components.items():
        target = config_names.target_class(conf) if isinstance(conf, DictConfig) else object
        if (check := getattr(target, "check_config", None)) is not None:
            check(cfg, key)


# /part


def check_values(cfg: DictConfig) -> None:
    """Numbers that must be positive (torch takes a learning rate of 0), and a model that fits the data."""
    batch_size = OmegaConf.select(cfg, "data.batch_size")
    if isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size <= 0:
        raise ValueError(f"data.batch_size={batch_size} must be a positive integer (the global batch size)")
    lr = OmegaConf.select(cfg, "model.optimizer.lr")
    if lr is not None and (not isinstance(lr, int | float) or isinstance(lr, bool) or lr <= 0):
        raise ValueError(f"model.optimizer.lr={lr} must be a positive number, e.g. model.optimizer.lr=0.001")
    model_classes, data_classes = (
        OmegaConf.select(cfg, "model.num_classes"),
        OmegaConf.select(cfg, "data.num_classes"),
    )
    if model_classes is not None and data_classes is not None and model_classes != data_classes:
        raise ValueError(
            f"model.num_classes={model_classes} but data.num_classes={data_classes}; the model's output size must "
            "match the dataset (leave model.num_classes at its default, ${data.num_classes})"
        )


def check_types(config: DictConfig, prefix: str, target: str | None = None) -> None:
    """Each value of `config` against the type hints of its class's constructor (`trainer.max_epochs=ten`).

    Only plain types are checked (int, float, bool, str, None, literals); a key whose hint also allows an
    object is left to the class.
    """
    target = target or config.get("_target_")
    if target is None:
        return
    try:
        cls = get_class(target)
    except Exception:  # an unknown target fails with Hydra's own message when instantiated
        return
    hints: dict[str, Any] = {}
    for klass in reversed(inspect.getmro(cls) if inspect.isclass(cls) else []):
        if "__init__" in vars(klass):
            try:
                hints |= typing.get_type_hints(klass.__init__)
            except Exception:  # annotations that do not resolve: nothing to check against
                continue
    for key, value in config.items():
        if key.startswith("_") or key not in hints or OmegaConf.is_missing(config, key):
            continue
        value = config[key]
        if not _matches(value, hints[key]):
            raise ValueError(f"{prefix}.{key}={value!r} is not valid: expected {_describe(hints[key])}")


_PLAIN = (int, float, bool, str, type(None))


def _matches(value: Any, hint: Any) -> bool:
    """Whether `value` fits one arm of `hint`; a bool is not a number here (YAML's true is no max_epochs)."""
    for arm in _arms(hint):
        if typing.get_origin(arm) is typing.Literal:
            if any(value == literal and type(value) is type(literal) for literal in get_args(arm)):
                return True
        elif arm not in _PLAIN or type(value) is arm or (arm is float and type(value) is int):
            return True  # an object, list or dict is allowed here: not ours to judge
    return False


def _describe(hint: Any) -> str:
    names = []
    for arm in _arms(hint):
        if typing.get_origin(arm) is typing.Literal:
            names.append("one of " + ", ".join(str(a) for a in get_args(arm)))
        else:
            names.append({type(None): "null"}.get(arm, getattr(arm, "__name__", str(arm))))
    return " or ".join(dict.fromkeys(names))


def check_launch() -> None:
    """A sweep must be started once; under torchrun or a multi-task srun every process would run all of it."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    hydra_cfg = HydraConfig.get()
    processes = environment.torchrun_world_size()
    if not processes and hydra_cfg.launcher._target_.endswith("BasicLauncher"):
        processes = int(os.environ.get("SLURM_NTASKS", 0)) if environment.slurm_job_id() else 0
    if processes > 1:
        raise RuntimeError(
            f"this sweep (-m) was started by torchrun or srun as {processes} processes, and each would run "
            "the whole sweep; start it once (python src/train.py -m ...) and let every job start its own "
            "processes: trainer=ddp (Lightning starts them), or a launcher that submits one cluster job per job"
        )


def check_trainer(trainer: DictConfig) -> None:
    """Combinations of precision, accelerator, devices and strategy that Lightning would refuse late, without
    naming the key, or not at all (a missing deepspeed: Lightning's own message is clear)."""
    precision = str(trainer.get("precision", "32-true"))
    accelerator = config_names.resolved_accelerator(trainer.get("accelerator", "auto"))
    strategy = config_names.strategy_name(trainer.get("strategy", "auto"))
    gpus = torch.cuda.device_count()
    for prefix, preset in config_names.GPU_ONLY_STRATEGIES.items():
        if strategy.startswith(prefix) and (accelerator != "cuda" or gpus == 0):
            why = f"this run uses accelerator={accelerator}" if gpus else "no CUDA GPU is visible here"
            raise ValueError(
                f"{preset} (trainer.strategy={strategy}) needs CUDA GPUs, but {why}; run it on a GPU "
                "machine, or test distributed code on the CPU with trainer=ddp_sim"
            )
    if accelerator == "cuda" and gpus == 0:  # Lightning: "No supported gpu backend found!"
        raise ValueError(
            f"trainer.accelerator={trainer.get('accelerator')} needs a CUDA GPU, but none is visible here; "
            "use trainer=cpu, or trainer=ddp_sim for DDP with processes on the CPU"
        )
    devices = trainer.get("devices", "auto")
    ids = isinstance(devices, ListConfig | list)
    asked = max(devices, default=-1) + 1 if ids else devices
    if accelerator == "cuda" and isinstance(asked, int) and asked > gpus:
        what = f"names GPU {asked - 1}" if ids else f"asks for {asked} GPUs"
        raise ValueError(
            f"trainer.devices={devices} {what}, but this machine has {gpus}; choose trainer.devices={gpus} "
            "or fewer (-1 uses all)"
        )
    if precision in ("16", "16-mixed") and accelerator == "cpu":
        raise ValueError(
            f"trainer.precision={precision} needs a CUDA GPU (fp16 autocast does not run on the CPU, and "
            "Lightning would silently switch to bf16-mixed); on the CPU use bf16-mixed, bf16-true or 32"
        )
    if precision in ("64", "64-true") and accelerator == "mps":
        raise ValueError(f"trainer.precision={precision}: MPS has no float64; use 32 or bf16-mixed on MPS")
