"""The checks and printing that `extras` runs before anything is instantiated."""

import warnings
from collections.abc import Sequence
from pathlib import Path

import rich.syntax
import rich.tree
from omegaconf import DictConfig, OmegaConf

from src.launch import environment
from src.run import memory


def apply_extras(cfg: DictConfig) -> None:
    """Run the conveniences of `cfg.extras` before anything heavy is instantiated."""
    extras = cfg.get("extras") or {}
    if extras.get("ignore_warnings"):
        warnings.filterwarnings("ignore")
    if extras.get("enforce_tags") and not cfg.get("tags"):
        raise ValueError(
            "tags is empty; label the run, e.g. tags=[baseline], or set extras.enforce_tags=false"
        )
    if extras.get("keep_freed_memory"):
        memory.keep_freed_memory()
    if extras.get("print_config"):
        print_config_tree(cfg, save_to=Path(cfg.paths.output_dir) / "config_tree.txt")


def print_config_tree(
    cfg: DictConfig,
    order: Sequence[str] = ("data", "model", "callbacks", "logger", "trainer", "paths", "extras"),
    save_to: Path | None = None,
) -> None:
    """Print the resolved config as a rich tree, main groups first, and save the same text to `save_to` (in
    global rank 0 only). Free of torch and Lightning, like this module: the report uses it too."""
    if not environment.is_global_rank_zero():
        return
    tree = rich.tree.Tree("CONFIG", style="dim", guide_style="dim")
    fields = [f for f in order if f in cfg] + [f for f in cfg if f not in order and f != "hydra"]
    for field in fields:
        branch = tree.add(field, style="bold", guide_style="dim")
        value = cfg[field]
        text = OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig) else str(value)
        branch.add(rich.syntax.Syntax(text, "yaml"))
    rich.print(tree)
    if save_to is not None:
        with open(save_to, "w") as file:
            rich.print(tree, file=file)
