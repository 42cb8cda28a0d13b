"""The checks and printing that `extras` runs before anything is instantiated."""

import logging
import warnings
from pathlib import Path

import rich.syntax
import rich.tree
from omegaconf import DictConfig, OmegaConf

from src.launch import environment
from src.run import memory

# What Lightning prints in every run that a user can do nothing about. Each is left out here, matched by its
# exact text, until the pinned Lightning stops printing it.
# - torch's FutureWarning that LeafSpec is deprecated, which Lightning's own CombinedLoader triggers in every
#   fit, test and predict (lightning/pytorch/utilities/_pytree.py; seen with the pinned torch 2.14.1 and
#   lightning 2.6.6); Lightning-AI/pytorch-lightning#21326.
PYTREE_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
# - Lightning 2.6's tips to install its litlogger and litmodels packages, logged at a Trainer's start unless a
#   logger is a LitLogger (or, for litmodels, a checkpoint callback is there, which eval's trainer lacks); no
#   setting turns them off (lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py and
#   callback_connector.py).
LIGHTNING_TIPS = (
    "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]",
    "💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels]",
)


# - Lightning's "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be
#   provided ...", when eval tests a training checkpoint with eval's callbacks: testing needs none of the
#   training callbacks' states (a checkpoint holds the weights to test, EMA's average included), so nothing is
#   missing. Left out only around eval's testing: a fit continued with fewer callbacks does lose their state
#   (lightning/pytorch/trainer/call.py).
CALLBACK_STATES_WARNING = r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint"


def no_tips(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(LIGHTNING_TIPS)


def apply_extras(cfg: DictConfig) -> None:
    """Run the conveniences of `cfg.extras` before anything heavy is instantiated, and leave out of the run's
    output what Lightning prints in every run and no user can act on (see above)."""
    warnings.filterwarnings(
        "ignore", PYTREE_WARNING, FutureWarning, r"lightning\.pytorch\.utilities\._pytree"
    )
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(no_tips)  # once, however many runs
    extras = cfg.get("extras") or {}
    if extras.get("ignore_warnings"):
        warnings.filterwarnings("ignore")
    if extras.get("enforce_tags") and not cfg.get("tags"):
        raise ValueError(
            "tags is empty; label the run, e.g. tags=[baseline], or set extras.enforce_tags=false"
        )
    if extras.get("keep_freed_memory"):
        memory.keep_freed_memory()
    if extras.get("print_config") and environment.is_global_rank_zero():
        print_config_tree(cfg, Path(cfg.paths.output_dir) / "config_tree.txt")


def print_config_tree(cfg: DictConfig, save_to: Path) -> None:
    """Print the resolved config as a rich tree, main groups first, and save the same text to `save_to`."""
    order = ("data", "model", "callbacks", "logger", "trainer", "paths", "extras")
    tree = rich.tree.Tree("CONFIG", style="dim", guide_style="dim")
    for field in [f for f in order if f in cfg] + [f for f in cfg if f not in order and f != "hydra"]:
        value = cfg[field]
        text = OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig) else str(value)
        tree.add(field, style="bold", guide_style="dim").add(rich.syntax.Syntax(text, "yaml"))
    rich.print(tree)
    with open(save_to, "w") as file:
        rich.print(tree, file=file)
