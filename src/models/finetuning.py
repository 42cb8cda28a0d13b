"""Fine-tuning a pretrained net: the backbone frozen for the first epochs, then trained at a share of the head's
rate, and no weight decay on biases and norm weights.

A net says which part is its head with `head_module()` (the part made anew for the task; the rest is the
backbone: src/models/components/pretrained.py). The settings are the model's hyperparameters
`freeze_backbone_epochs`, `backbone_lr_scale` and `decay_norm_and_bias` (configs/model/classifier.yaml);
TaskModule checks them with `check`, builds its optimizer from `parameter_groups` and freezes with the
`FrozenBackbone` callback it brings (`configure_callbacks`).
"""

import logging
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf
from torch import nn

from src.common.config_names import strategy_name

log = logging.getLogger(__name__)

# The normalisation layers with running statistics, which a frozen backbone keeps in eval mode.
NORMS = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.LazyBatchNorm1d,
    nn.LazyBatchNorm2d,
    nn.LazyBatchNorm3d,
    nn.LazyInstanceNorm1d,
    nn.LazyInstanceNorm2d,
    nn.LazyInstanceNorm3d,
)


def check(net: nn.Module, hparams: Any) -> None:
    """The settings' errors, when the module is made: each names the key, its value and what is valid."""
    frozen, scale = hparams.get("freeze_backbone_epochs", 0), hparams.get("backbone_lr_scale", 1.0)
    if frozen < 0:
        raise ValueError(f"model.freeze_backbone_epochs={frozen} must be 0 (never frozen) or more")
    if scale < 0:
        raise ValueError(f"model.backbone_lr_scale={scale} must be 0 or more (1: the head's rate)")
    if (frozen or scale != 1) and not hasattr(net, "head_module"):
        raise ValueError(
            f"model.freeze_backbone_epochs={frozen} and model.backbone_lr_scale={scale} need a net that says "
            f"which part is its head; {type(net).__name__} does not (it has no head_module()): leave them at 0 and 1"
        )


def check_config(cfg: DictConfig, key: str) -> None:
    """DDP gives every parameter a gradient share each step; a frozen backbone gets none, which plain DDP takes
    for a bug in the model and stops at the second step. TaskModule's `check_config`, which preflight runs
    before anything is instantiated."""
    frozen = OmegaConf.select(cfg, f"{key}.freeze_backbone_epochs")
    strategy = OmegaConf.select(cfg, "trainer.strategy")
    if not frozen or strategy is None:
        return
    name = strategy_name(strategy)
    as_config = isinstance(strategy, DictConfig)
    allows_unused = "find_unused_parameters_true" in name or (
        as_config and strategy.get("find_unused_parameters")
    )
    if name.startswith("ddp") and not allows_unused:
        fix = (
            "strategy.find_unused_parameters=true"
            if as_config
            else "strategy=ddp_find_unused_parameters_true"
        )
        raise ValueError(
            f"{key}.freeze_backbone_epochs={frozen} under trainer.strategy={name}: DDP must allow parameters "
            f"without gradients while the backbone is frozen; add trainer.{fix}"
        )


def parameter_groups(module: L.LightningModule) -> list[dict[str, Any]] | None:
    """The optimizer's parameter groups, each named for the LR monitor: `backbone` (with an `lr_scale` of
    backbone_lr_scale, which `scale_rates` applies) and `head` for a net with a head_module(), each with a
    `_no_decay` twin holding the biases and norm weights (the 1-D tensors) when the optimizer decays weights and
    decay_norm_and_bias is off. None: one group of every parameter, the optimizer's default."""
    hparams, net = module.hparams, module.net
    has_head = hasattr(net, "head_module")
    split_decay = bool(hparams.optimizer.get("weight_decay")) and not hparams.get("decay_norm_and_bias")
    if not has_head and not split_decay:
        return None
    head = set(net.head_module().parameters()) if has_head else set()
    groups: dict[str, dict[str, Any]] = {}
    for parameter in module.parameters():
        part = ("head" if parameter in head else "backbone") if has_head else "decay"
        if split_decay and parameter.ndim <= 1:
            part = f"{part}_no_decay" if has_head else "no_decay"
        group = groups.setdefault(part, {"name": part, "params": []})
        group["params"].append(parameter)
        if part.startswith("backbone"):
            group["lr_scale"] = hparams.get("backbone_lr_scale", 1.0)
        if part.endswith("no_decay"):
            group["weight_decay"] = 0.0
    return list(groups.values())


def scale_rates(optimizer: Any) -> None:
    """Each group's rate times its `lr_scale` (the backbone's): the scaled rate is the group's base rate, which
    schedulers then follow."""
    for group in optimizer.param_groups:
        group["lr"] *= group.pop("lr_scale", 1.0)


class FrozenBackbone(L.Callback):
    """For the first `epochs` epochs no parameter but the head's gets a gradient, and the backbone's norm layers
    stay in eval mode so that their running statistics do not move either (Lightning puts each layer back in the
    mode it had after validation)."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs
        self.frozen = False
        self.trainable: set[nn.Parameter] | None = None  # what the net trains; what it froze itself stays so

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Also here, not only at each epoch's start: a run resumed mid-epoch skips that hook, and must land
        # in the phase its epoch is in.
        self.set_frozen(pl_module, trainer.current_epoch < self.epochs)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.set_frozen(pl_module, trainer.current_epoch < self.epochs)

    def set_frozen(self, module: L.LightningModule, frozen: bool) -> None:
        head = module.net.head_module()
        head_parameters, head_layers = set(head.parameters()), set(head.modules())
        if self.trainable is None:  # the first call, before anything is frozen (a LoRA base is, by design)
            self.trainable = {parameter for parameter in module.net.parameters() if parameter.requires_grad}
        for parameter in self.trainable - head_parameters:
            parameter.requires_grad_(not frozen)
        for layer in module.net.modules():
            if isinstance(layer, NORMS) and layer not in head_layers:
                layer.train(module.training and not frozen)
        if frozen != self.frozen:
            log.info(f"{'Froze' if frozen else 'Unfroze'} the backbone at epoch {module.current_epoch}")
        self.frozen = frozen
