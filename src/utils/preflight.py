"""Checks on the trainer and launch settings, run before anything is instantiated.

A combination that cannot work fails here in a second, with one line naming the key to change, instead of
minutes later deep inside Lightning, or not at all (Lightning silently swaps 16-mixed for bf16-mixed on the CPU).
"""

import importlib.util
import os
from typing import Any, get_args

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.plugins.precision.precision import (
    _PRECISION_INPUT_STR,
    _PRECISION_INPUT_STR_ALIAS_CONVERSION,
)
from omegaconf import DictConfig, ListConfig

from src.utils import launchers

PRECISIONS = get_args(_PRECISION_INPUT_STR)  # "32-true", "16-mixed", "bf16-mixed", "bf16-true", ...

# Strategies Lightning runs on CUDA GPUs only, by the prefix of their registered name or class.
GPU_ONLY_STRATEGIES = {"fsdp": "trainer=fsdp", "deepspeed": "trainer=deepspeed"}


def check_run(cfg: DictConfig) -> None:
    """Refuse a run whose trainer settings or launch cannot work; each error names what to change."""
    check_launch()
    if "trainer" in cfg:
        check_trainer(cfg.trainer)


def check_launch() -> None:
    """A sweep must be started once; under torchrun or a multi-task srun every process would run all of it."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    hydra_cfg = HydraConfig.get()
    processes = launchers.torchrun_world_size()
    if not processes and hydra_cfg.launcher._target_.endswith("BasicLauncher"):
        processes = int(os.environ.get("SLURM_NTASKS", 0)) if launchers.slurm_job_id() else 0
    if processes > 1:
        raise RuntimeError(
            f"this sweep (-m) was started by torchrun or srun as {processes} processes, and each would run "
            "the whole sweep; start it once (python src/train.py -m ...) and let every job start its own "
            "processes: trainer=ddp (Lightning starts them) or hydra/launcher=slurm (one SLURM job per job)"
        )


def strategy_name(strategy: Any) -> str:
    """`ddp`, `fsdp`, `deepspeed_stage_2`, ... for a strategy given by name or as a config with a _target_."""
    if isinstance(strategy, DictConfig | dict) and "_target_" in strategy:
        return strategy["_target_"].rsplit(".", 1)[-1].removesuffix("Strategy").lower()
    return str(strategy).lower()


def resolved_accelerator(accelerator: Any) -> str:
    """The device kind a Trainer will use: cuda, mps or cpu (`auto` picks the best one present)."""
    name = str(accelerator).lower()
    if name == "gpu":
        return "cuda"
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    return name


def check_trainer(trainer: DictConfig) -> None:
    """Precision, accelerator, devices and strategy: valid values, and combinations that can run here."""
    requested = str(trainer.get("precision", "32-true"))
    precision = _PRECISION_INPUT_STR_ALIAS_CONVERSION.get(requested, requested)
    if precision not in PRECISIONS:
        raise ValueError(
            f"trainer.precision={requested} is not a precision; choose one of 32, 64, {', '.join(PRECISIONS)}"
        )
    accelerator = resolved_accelerator(trainer.get("accelerator", "auto"))
    strategy = strategy_name(trainer.get("strategy", "auto"))

    gpus = torch.cuda.device_count()
    for prefix, preset in GPU_ONLY_STRATEGIES.items():
        if strategy.startswith(prefix) and (accelerator != "cuda" or gpus == 0):
            why = f"this run uses accelerator={accelerator}" if gpus else "no CUDA GPU is visible here"
            raise ValueError(
                f"{preset} (trainer.strategy={strategy}) needs CUDA GPUs, but {why}; run it on a GPU "
                "machine, or test distributed code on the CPU with trainer=ddp_sim"
            )
    if strategy.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        raise ModuleNotFoundError(
            "trainer=deepspeed needs the deepspeed package: pip install -e '.[deepspeed]'"
        )
    if accelerator == "cuda":
        _check_gpu_count(trainer, gpus)
    if precision == "16-mixed" and accelerator == "cpu":
        raise ValueError(
            f"trainer.precision={requested} needs a CUDA GPU (fp16 autocast does not run on the CPU, and "
            "Lightning would silently switch to bf16-mixed); on the CPU use bf16-mixed, bf16-true or 32"
        )
    if precision == "64-true" and accelerator == "mps":
        raise ValueError(f"trainer.precision={requested}: MPS has no float64; use 32 or bf16-mixed on MPS")


def _check_gpu_count(trainer: DictConfig, available: int) -> None:
    devices = trainer.get("devices", "auto")
    if available == 0:
        raise ValueError(
            f"trainer.accelerator={trainer.get('accelerator')} needs a CUDA GPU, but none is visible here; "
            "use trainer=cpu, or trainer=ddp_sim for DDP with processes on the CPU"
        )
    if isinstance(devices, int) and devices > available:
        raise ValueError(
            f"trainer.devices={devices} asks for {devices} GPUs, but this machine has {available}; "
            f"choose trainer.devices={available} or fewer (-1 uses all)"
        )
    if isinstance(devices, ListConfig | list) and max(devices, default=0) >= available:
        raise ValueError(
            f"trainer.devices={list(devices)} names GPU {max(devices)}, but this machine has GPUs "
            f"0..{available - 1}; choose ids from that range"
        )
