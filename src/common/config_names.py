"""What the names in a config stand for, such as the strategy and the accelerator a trainer config names. The
preflight checks, the device settings (src/run/hardware.py), callbacks and models all read them; here, so that
none of them imports another, and nobody builds on the checker."""

from typing import Any

import torch
from hydra.utils import get_object
from omegaconf import DictConfig

# Strategies Lightning runs on CUDA GPUs only, by the prefix of their registered name or class.
GPU_ONLY_STRATEGIES = {"fsdp": "trainer=fsdp", "deepspeed": "trainer=deepspeed"}


def strategy_name(strategy: Any) -> str:
    """`ddp`, `fsdp`, `deepspeed_stage_2`, ... for a strategy given by name or as a config with a _target_."""
    if isinstance(strategy, DictConfig | dict) and "_target_" in strategy:
        return strategy["_target_"].rsplit(".", 1)[-1].removesuffix("Strategy").lower()
    return str(strategy).lower()


def resolved_accelerator(accelerator: Any) -> str:
    """The device kind a Trainer will use: cuda, mps or cpu (`auto` picks the best one present)."""
    name = str(accelerator).lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    return "cuda" if name == "gpu" else name


def target_class(conf: DictConfig) -> type:
    """The class a config's _target_ names; `object` when it has none or it cannot be imported (Hydra says why
    when it is instantiated)."""
    try:
        found = get_object(conf._target_) if "_target_" in conf else object
    except Exception:
        return object
    return found if isinstance(found, type) else object  # a function's config names no class
