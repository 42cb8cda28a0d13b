"""OmegaConf resolvers used by the configs (kept free of heavy imports: `--help` loads this module)."""

from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from src.launch import environment


def project_root(*, _root_: DictConfig) -> str:
    """The parent of the primary config directory, as Hydra found it (independent of the working directory)."""
    # While Hydra sets up a run or sweep the config still holds its `hydra` node; in the job it is in HydraConfig.
    if "hydra" in _root_:
        sources = _root_.hydra.runtime.config_sources
    elif HydraConfig.initialized():
        sources = HydraConfig.get().runtime.config_sources
    else:
        raise RuntimeError(
            "${project_root:} needs a Hydra run: start from src/train.py, or compose with "
            "return_hydra_config=True, or set paths.root_dir"
        )
    for source in sources:
        if source.provider == "main" and source.schema == "file":
            return str(Path(source.path).parent)
    raise RuntimeError(
        "${project_root:} found no primary config directory on the file system; set paths.root_dir"
    )


def if_rank_zero(value: Any, otherwise: Any = None) -> Any:
    """`value` in global rank 0, `otherwise` in every other rank (rank from torchrun, SLURM or Lightning)."""
    return value if environment.is_global_rank_zero() else otherwise


def sweep_group() -> str | None:
    """The name of the sweep a multirun job belongs to (its sweep dir's name), None outside a multirun.

    Loggers group a sweep's runs by it (wandb's `group`): a timestamp for a grid sweep, the study's name for
    a search that stores one.
    """
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(HydraConfig.get().sweep.dir).name


def run_label() -> str | None:
    """A recognisable run name: the job's overrides (`model/net=mlp,trainer.max_epochs=3`), or the run dir's name
    when there are none. Keys in hydra.job.config.override_dirname.exclude_keys (paths, extras) are left out."""
    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    if hydra.job.override_dirname:
        return hydra.job.override_dirname
    # A config composed with Hydra's compose API (tests, notebooks) has no run dir: wandb picks a name.
    output_dir = OmegaConf.select(hydra, "runtime.output_dir", throw_on_missing=False)
    return Path(output_dir).name if output_dir and output_dir != "???" else None


def snapshot_subdir(run_dir: str) -> str:
    """Where Hydra writes this launch's config snapshot inside the run dir: `.hydra`, or for a later attempt
    of a named run `.hydra/attempts/<time>`, so that the first snapshot is never overwritten."""
    if not (Path(run_dir) / ".hydra" / "config.yaml").exists():
        return ".hydra"
    return f".hydra/attempts/{datetime.now().strftime(environment.STAMP_FORMAT)}"


# part: text
def first_set(*values: Any) -> Any:
    """The first value that is not null (model.net.tokenizer: the weights' folder, else the hub name)."""
    return next((value for value in values if value is not None), None)


# /part


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("project_root", project_root, replace=True)
    # Cached like Hydra's ${now:}: one value per process, however often the run dir is resolved.
    OmegaConf.register_new_resolver("run_dir_name", environment.run_dir_name, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("if_rank_zero", if_rank_zero, replace=True)
    OmegaConf.register_new_resolver("sweep_group", sweep_group, replace=True)
    OmegaConf.register_new_resolver("run_label", run_label, replace=True)
    OmegaConf.register_new_resolver("snapshot_subdir", snapshot_subdir, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("first_set", first_set, replace=True)  # [part: text]
