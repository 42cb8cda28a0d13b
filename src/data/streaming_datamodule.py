"""Any data option, streamed from the litdata shards `python src/shard.py` wrote (`data=streaming`): on a local
disk, or in object storage with a local cache.

The shards say what they hold (shards.json, src/data/components/shards.py): the classes, the input shape, the
task, and the config of the data option they came from. That option is built from its config, never set up
(its files need not be here), and lends this one what a run on it would use: its transforms for each stage
(image files are stored as their bytes and decoded here), its collate, its batch augmentation
(on_after_batch_transfer) and its inference preprocessing, so that a checkpoint trained from the shards
predicts and exports like one trained from the option itself.

Each split is a litdata StreamingDataset, built in its *_dataloader() (under DDP only then does it know the
ranks: built before the process group exists, one rank would read everything). litdata's StreamingDataLoader
has a length (from the shards' index: `trainer.estimated_stepping_batches` and model/scheduler=warmup_cosine
work) and a state that Lightning saves in every checkpoint, so a run resumed mid-epoch continues with the
batches it would have had.
"""

from collections.abc import Callable, Iterator, Sequence
from functools import cached_property, partial
from typing import Any

import lightning as L
import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.utils.data import DataLoader, default_collate

from src.data.components.shards import SPLITS, check_chunks, litdata, read_facts, remote_options
from src.data.datamodule import DataModule, split_batch_size

# What the shards say that data=streaming's config leaves null (configs/data/streaming.yaml): the model's
# configs read them (${data.num_classes}, ${data.input_shape}, ${data.ignore_index}).
FACT_KEYS = ("task", "num_classes", "class_names", "input_shape", "ignore_index")


class InLoaderOrder:
    """The samples of a split, one by one, in the order its loader gives them (its batches taken apart):
    predict pairs each prediction with the sample it was made from."""

    def __init__(self, loader: Callable[[], DataLoader]) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader():
            yield from batch


class StreamingDataModule(DataModule):
    """The splits of the shards at `input_dir` (a folder, or an s3:// URL). Every argument is
    documented in configs/data/streaming.yaml; `task`, `num_classes`, `class_names`, `input_shape` and
    `ignore_index` come from the shards (`complete_config` fills them in before a run; null ones are read at
    setup)."""

    name = "streaming"
    task: str | None = None  # classification, segmentation, ...: the shards say which

    @classmethod
    def complete_config(cls, cfg: DictConfig) -> None:
        """Fill the data keys the shards know (FACT_KEYS) from their shards.json, before anything reads them; a
        key set to something else is refused, and so are shards of another task than the model's. Errors name
        data.input_dir and the fix when it holds no finished shards."""
        data = cfg.data
        facts = read_facts(str(data.input_dir), options=data.get("storage_options"))
        for key in FACT_KEYS:
            given = data.get(key)
            given = OmegaConf.to_container(given) if OmegaConf.is_config(given) else given
            if given is None:
                with open_dict(data):  # a subclass's config may leave a key out
                    data[key] = facts[key]
            elif given != facts[key]:
                raise ValueError(
                    f"data.{key}={given} but the shards at data.input_dir={data.input_dir} have {facts[key]}; "
                    f"leave data.{key}=null: it follows the shards"
                )
        model_target = OmegaConf.select(cfg, "model._target_")
        model_task = getattr(get_class(model_target), "task", None) if model_target else None
        if model_task not in (None, "any") and facts["task"] not in (None, model_task):
            raise ValueError(
                f"data.input_dir={data.input_dir} holds {facts['task']} shards but the model "
                f"({model_target.rsplit('.', 1)[-1]}) is a {model_task} model; choose a model option for "
                f"{facts['task']} (its model= option), or shards of {model_task} data"
            )

    def __init__(
        self,
        input_dir: str,
        task: str | None = None,
        num_classes: int | None = None,
        class_names: Sequence[str] | None = None,
        input_shape: Sequence[int] | None = None,
        ignore_index: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        max_cache_size: int | str = "100GB",
        num_folds: int | None = None,
        **settings: Any,
    ) -> None:
        """`settings`: the DataModule's (augment, batch_size, num_workers, drop_last, ...; see there)."""
        if num_folds is not None:  # the shards hold one split: their folds are the shard command's
            raise ValueError(
                f"data.num_folds={num_folds}: data=streaming trains on the splits its shards hold; write one set "
                f"of shards per fold instead (python src/shard.py data=<option> data.num_folds={num_folds} "
                "data.fold=<i> output_dir=<dir>/fold<i>) and leave data.num_folds=null here"
            )
        super().__init__(input_shape=input_shape, **settings)
        self.task = task
        self.source: L.LightningDataModule | None = None  # the option the shards came from, once set up
        self.decoders: dict[str, Callable[[Any], Any]] = {}  # stored sample -> item, per split (files only)

    @cached_property
    def facts(self) -> dict[str, Any]:
        """The shards' shards.json."""
        return read_facts(self.hparams.input_dir, options=self.hparams.storage_options)

    def setup(self, stage: str | None = None) -> None:
        world_size = self.trainer.world_size if self.trainer is not None else 1
        self.batch_size_per_device = split_batch_size(self.hparams.batch_size, world_size)
        if self.source is not None:
            return
        facts = self.facts
        check_chunks(self.hparams.input_dir, facts, options=self.hparams.storage_options)
        for key in FACT_KEYS:  # built from a config without them (predict's, on a run's test split)
            if self.hparams[key] is None:
                self.hparams[key] = facts[key]
        self.task = self.hparams.task
        config = dict(facts["data"])
        if "augment" in config:  # data.augment=false (debug=overfit) turns the source's augmentation off
            config["augment"] = self.hparams.augment
        self.source = instantiate(config, _convert_="all")
        self.source.trainer = self.trainer  # its batch augmentation asks whether the trainer is training
        collate = getattr(self.source, "collate_fn", None)
        # `list` marks batches that an in-memory dataset makes whole; from shards they come one sample at a time.
        self.collate_fn = default_collate if collate in (None, list) else collate
        if facts["encoding"] == "files":
            self.decoders = {split: self.source.shard_decoder(split) for split in SPLITS}
        self.data_test = InLoaderOrder(partial(self._loader, "test", train=False, collate=list))

    def _loader(self, split: str, train: bool, collate: Callable | None = None) -> DataLoader:
        if self.source is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before asking for a DataLoader")
        streaming = litdata()
        hp = self.hparams
        distributed = self.trainer is not None and self.trainer.world_size > 1
        overfitting = self.trainer is not None and bool(self.trainer.overfit_batches)
        # litdata shuffles with NumPy, which takes 32 bits
        seed = self._shuffle_seed() % 2**32 if train else 0
        dataset = streaming.StreamingDataset(
            f"{hp.input_dir}/{split}",
            cache_dir=hp.cache_dir,
            max_cache_size=hp.max_cache_size,
            storage_options=remote_options(hp.input_dir, hp.storage_options, "data.storage_options"),
            transform=self.decoders.get(split),
            shuffle=train and not overfitting,  # overfit_batches: the same batches every epoch
            seed=seed,
            # Training under DDP: every rank the same number of batches, or the ranks' collectives hang;
            # litdata then drops the remainder. Validation and test see every sample.
            drop_last=(hp.drop_last or distributed) if train else False,
        )
        workers = hp.num_workers
        # Its state, saved in checkpoints, is rank 0's alone under DDP, and every rank loads it. That is enough:
        # the state counts the samples this rank had this epoch (the same on every rank: each gets as many full
        # batches) and each rank finds its own share from its rank, so it puts every rank back in its own place.
        from src.data.components.streaming_loader import StreamingLoader  # imports litdata

        return StreamingLoader(
            dataset,
            epoch=lambda: self.trainer.current_epoch if train and self.trainer is not None else None,
            batch_size=self.batch_size_per_device,
            num_workers=workers,
            collate_fn=collate or self.collate_fn,
            pin_memory=hp.pin_memory,
            persistent_workers=hp.persistent_workers and workers > 0,
            prefetch_factor=hp.prefetch_factor if workers > 0 else None,
            # A generator of its own, as DataModule's training loader has: starting to iterate then draws
            # nothing from torch's global one, so a run resumed mid-epoch keeps the random numbers of dropout
            # and augmentation where they were.
            generator=torch.Generator().manual_seed(seed),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return self.source.on_before_batch_transfer(batch, dataloader_idx) if self.source else batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """The source option's batch augmentation (mnist5k's random shift), on the device."""
        return self.source.on_after_batch_transfer(batch, dataloader_idx) if self.source else batch

    # part: predict
    def inference_preprocessing(self) -> dict[str, Any]:
        """The source option's: image files become what its test images became."""
        preprocessing = getattr(self.source, "inference_preprocessing", None)
        return preprocessing() if preprocessing else self.facts["preprocessing"]

    # /part
