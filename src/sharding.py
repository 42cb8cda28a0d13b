"""The task of `python src/shard.py`: a data option's splits written as litdata shards for data=streaming, in
the format that src/data/components/shards.py describes and reads."""

import logging
import sys
from functools import partial
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset, Subset

from src.data.components.shards import (
    FACTS_FILE,
    FORMAT,
    PARTIAL_FILE,
    SPLITS,
    Folder,
    litdata,
    open_folder,
    remote_options,
)
from src.run.builder import complete_config, prepare
from src.run.resume import config_changes

log = logging.getLogger(__name__)

# How the source option loads batches: no part of what the shards hold, so re-sharding with other values of
# these is the same output.
LOADER_KEYS = (
    "batch_size",
    "num_workers",
    "pin_memory",
    "persistent_workers",
    "prefetch_factor",
    "drop_last",
)


def shard(cfg: DictConfig) -> None:
    """Write the splits of `cfg.data` as shards to `cfg.output_dir`; nothing when they are there already.

    shards.json holds: `format`; `data`, the source data config (resolved, with its _target_); `task`,
    `num_classes`, `class_names`, `ignore_index` (segmentation) and `input_shape`, as the source option says
    them after setup(); `preprocessing`, its inference_preprocessing() (null without one); `encoding`
    (files or tensors); `samples`, the sample count of each split.
    """
    complete_config(cfg)  # as a run does: the keys its data fills (an image folder's, from the net's weights)
    prepare(cfg)  # checks, extras, seed
    output = str(cfg.output_dir).rstrip("/")
    source = OmegaConf.to_container(cfg.data, resolve=True)
    options = remote_options(output, cfg.get("storage_options"), "storage_options")
    folder = open_folder(output, "output_dir", options)
    if not should_write(folder, source):
        return
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("fit")  # every split, as a run of the source option would draw them
    folder.write_json(PARTIAL_FILE, {"data": source})  # before the first shard: the folder is ours
    datasets = {split: getattr(datamodule, f"data_{split}") for split in SPLITS}
    encoding = "files" if hasattr(unwrapped(datasets["train"], 0)[0], "to_shard") else "tensors"
    for split, dataset in datasets.items():
        # Training samples in a random order (`seed`): litdata shuffles chunks and the samples within each,
        # never across the set, so shards written in the source's order (often class by class) would give
        # batches of a few classes each. Validation and test keep the source's order.
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(cfg.seed))
        indices = order.tolist() if split == "train" else list(range(len(dataset)))
        write_split(dataset, indices, f"{output}/{split}", cfg, options)
        log.info(f"Wrote the {len(dataset)} samples of {split} ({encoding}) to {output}/{split}")
    hparams = datamodule.hparams
    preprocessing = getattr(datamodule, "inference_preprocessing", None)
    folder.write_json(
        FACTS_FILE,
        {
            "format": FORMAT,
            "data": source,
            "task": getattr(datamodule, "task", None),
            "num_classes": hparams.get("num_classes"),
            "class_names": list(hparams["class_names"]) if hparams.get("class_names") else None,
            "ignore_index": hparams.get("ignore_index"),
            "input_shape": list(hparams.input_shape),
            "preprocessing": preprocessing() if preprocessing else None,
            "encoding": encoding,
            "samples": {split: len(dataset) for split, dataset in datasets.items()},
        },
    )
    folder.remove(PARTIAL_FILE)
    log.info(f"Shards finished: train from them with data=streaming data.input_dir={output}")


def should_write(folder: Folder, source: dict[str, Any]) -> bool:
    """False when the folder holds finished shards of this source config; True when it is empty, new, or this
    command's half-written output (cleared here); an error when it holds anything else."""
    where = f"output_dir={folder.location}"
    facts = folder.read_json(FACTS_FILE)
    if facts is not None:
        changes = config_changes(without_loader_keys(facts.get("data")), without_loader_keys(source))
        if not changes:
            log.info(f"{where} holds these shards already ({FACTS_FILE}): nothing to do")
            return False
        raise FileExistsError(
            f"{where} holds shards of another data config (data.{'; data.'.join(changes)}); choose another "
            "output_dir, or delete that folder to write them again"
        )
    names = folder.names()
    if PARTIAL_FILE in names:
        log.warning(f"{where} is a half-written output of this command (no {FACTS_FILE}): writing it again")
        for name in names:
            folder.remove(name)
    elif names:
        raise FileExistsError(
            f"{where} is not empty and holds no shards of this command ({', '.join(names[:3])}, ...); choose "
            "a new or empty folder"
        )
    return True


def without_loader_keys(config: Any) -> dict[str, Any]:
    return {key: value for key, value in (config or {}).items() if key not in LOADER_KEYS}


def unwrapped(dataset: Dataset, index: int) -> tuple[Dataset, int]:
    """The dataset an item really comes from, and its index there, through Subsets (splits, folds)."""
    while isinstance(dataset, Subset):
        dataset, index = dataset.dataset, dataset.indices[index]
    return dataset, index


def stored_sample(dataset: Dataset, index: int) -> Any:
    """Sample `index` as the shards store it: its files' bytes (`to_shard`), else the item itself."""
    dataset, index = unwrapped(dataset, index)
    return dataset.to_shard(index) if hasattr(dataset, "to_shard") else dataset[index]


def write_split(
    dataset: Dataset, indices: list[int], output: str, cfg: DictConfig, options: dict[str, Any]
) -> None:
    litdata().optimize(
        fn=partial(stored_sample, dataset),
        inputs=indices,
        output_dir=output,
        chunk_bytes=cfg.chunk_bytes,
        num_workers=max(1, min(cfg.num_workers, len(dataset))),
        # Forked workers share the loaded dataset, as PyTorch's DataLoader workers do on Linux; litdata's
        # default (spawn) starts each as a new interpreter that imports torch again: seconds per split.
        start_method="fork" if sys.platform == "linux" else None,
        storage_options=options,
        verbose=False,
    )
