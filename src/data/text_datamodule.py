"""Your own texts with labels: CSV, TSV, JSON lines or Parquet files (`data=text_file`).

Files are read and checked before training (columns, empty texts, labels), tokenized by the net's tokenizer
once (the ids are cached on disk, keyed by the file's bytes and the tokenizer: components/token_cache.py) and
padded per batch to the batch's longest text (components/text_batches.py). The class names are stored in the
hyperparameters, so every checkpoint carries them, as for images.
"""

import logging
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Dataset, Subset

from src.common.text import load_tokenizer
from src.data.classification_datamodule import ClassificationDataModule
from src.data.components.resumable import ResumableDataLoader
from src.data.components.text_batches import (
    LengthGroupedBatchSampler,
    PadCollate,
    epoch_batches,
    padding_saved,
)
from src.data.components.text_files import read_text_file
from src.data.components.token_cache import TokenizedTexts, cached_tokens
from src.data.datamodule import assign_parts

log = logging.getLogger(__name__)

STAGES = ("train", "val", "test")


class TextDataModule(ClassificationDataModule):
    """Texts and labels from table files; every argument is documented in configs/data/text_file.yaml.

    A sample is `(token ids (n,), class index)`, a batch `({"input_ids", "attention_mask"} (B, L), labels
    (B,))` with L the batch's longest sample. `prepare` is a function config called when the datamodule is
    built (so before the net, which loads the tokenizer it may write): it must keep existing files and may run
    in every process at once (make_example_texts does both).
    """

    name = "text file"
    task = "text_classification"

    @classmethod
    def complete_config(cls, cfg: DictConfig) -> None:
        """Data that ships its tokenizer (data=example_texts) hands it to a net that has none, so that the
        net's embeddings and the data's ids agree; a net's own tokenizer is the data's too (the config)."""
        net, tokenizer = OmegaConf.select(cfg, "model.net"), cfg.data.get("tokenizer")
        if isinstance(net, DictConfig) and "tokenizer" in net and net.tokenizer is None and tokenizer:
            net.tokenizer = tokenizer

    def __init__(
        self,
        train_file: str,
        num_classes: int,
        tokenizer: str | None,
        val_file: str | None = None,
        test_file: str | None = None,
        text_column: str = "text",
        label_column: str = "label",
        class_names: Sequence[str] | None = None,
        max_length: int = 128,
        group_by_length: bool = False,
        drop_empty: bool = False,
        cache_dir: str | None = None,
        prepare: dict[str, Any] | None = None,
        split: Sequence[int | float] = (0.8, 0.1, 0.1),
        split_seed: int = 42,
        **settings: Any,
    ) -> None:
        """`settings`: the DataModule's (num_folds, fold, batch_size, num_workers, ...; see there)."""
        if max_length < 2:
            raise ValueError(
                f"data.max_length={max_length} must be at least 2 (tokens per text, special ones too)"
            )
        if len(split) != 3:
            raise ValueError(f"data.split={list(split)} needs 3 entries: the train, val and test shares")
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(
                f"data.class_names has {len(class_names)} names but data.num_classes={num_classes}; give one "
                "name per class, in class-index order, or null"
            )
        super().__init__(
            num_classes=num_classes, input_shape=[max_length], split=split, split_seed=split_seed, **settings
        )
        if prepare is not None:
            instantiate(prepare)
        self.reported = False  # the padding saved is logged once per run

    @cached_property
    def tokenizer(self) -> Any:
        return load_tokenizer(self.hparams.tokenizer, "data.tokenizer")

    def prepare_data(self) -> None:
        """Tokenize every file into the cache (once per node: the other processes read it in setup)."""
        for stage in STAGES:
            if self._file(stage):
                self._tokens(stage, write=True)

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        hp = self.hparams
        write = self.trainer is None or self.trainer.local_rank == 0
        files = {stage: self._tokens(stage, write) for stage in STAGES if self._file(stage)}
        names = self._class_names(files["train"][1])
        labelled = {stage: self._indices(stage, labels, names) for stage, (_, labels, _) in files.items()}
        drawn = self._split(labelled["train"], has_own=set(files) - {"train"})
        datasets = []
        for stage in STAGES:
            if stage != "train" and stage in files:  # its own file, whole
                tokens, rows, targets = files[stage][0], files[stage][2], labelled[stage]
            else:  # drawn from the training file
                tokens, keep = files["train"][0], files["train"][2]
                rows = [keep[i] for i in drawn[stage]]
                targets = [labelled["train"][i] for i in drawn[stage]]
            datasets.append(TokenizedTexts.joined([(tokens, rows)], targets, hp.max_length))
        hp.class_names = names  # saved with every checkpoint
        truncated = sum(dataset.truncated() for dataset in datasets)
        if truncated and self._reports():
            log.warning(
                f"{truncated} of {sum(map(len, datasets))} texts are longer than data.max_length={hp.max_length} "
                "tokens and were cut; raise data.max_length to keep them whole"
            )
        return tuple(datasets)

    def fold_pool(self, train: TokenizedTexts, val: TokenizedTexts) -> tuple[Dataset, Dataset]:
        """The train then the val texts as one dataset, for both: texts are not augmented."""
        parts = [(dataset.tokens, range(len(dataset))) for dataset in (train, val)]
        pool = TokenizedTexts.joined(parts, [*train.targets, *val.targets], self.hparams.max_length)
        return pool, pool

    def _check_shapes(self, dataset: Dataset) -> None:
        """Texts have no fixed shape: lengths vary up to max_length, which the datasets apply."""

    # part: predict
    def inference_preprocessing(self) -> dict[str, Any]:
        """How predict reads and tokenizes texts: plain data, stored in the model's checkpoints."""
        hp = self.hparams
        return {
            "kind": "text",
            "tokenizer": hp.tokenizer,
            "max_length": hp.max_length,
            "text_column": hp.text_column,
        }

    # /part

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        self.collate_fn = PadCollate(self.tokenizer.pad_token_id or 0)

    def train_dataloader(self) -> DataLoader:
        loader = super().train_dataloader()
        hp = self.hparams
        if hp.group_by_length:
            batches = loader.batch_sampler
            grouped = LengthGroupedBatchSampler(
                batches.sampler, batches.batch_size, batches.drop_last, lengths_of(self.data_train)
            )
            loader = ResumableDataLoader(
                loader.dataset,
                batch_sampler=grouped,
                generator=loader.generator,
                collate_fn=loader.collate_fn,
                num_workers=loader.num_workers,
                pin_memory=loader.pin_memory,
                persistent_workers=loader.persistent_workers,
                prefetch_factor=loader.prefetch_factor,
            )
        if not self.reported and self._reports():
            self.reported = True
            dynamic, full = padding_saved(
                lengths_of(self.data_train), epoch_batches(loader.batch_sampler), hp.max_length
            )
            log.info(
                f"Dynamic padding: {dynamic:,} token positions per epoch instead of {full:,} padded to "
                f"data.max_length={hp.max_length} ({1 - dynamic / full:.0%} fewer; data.group_by_length="
                f"{str(hp.group_by_length).lower()})"
            )
        return loader

    def _reports(self) -> bool:
        """Whether this process logs the run's one-off figures: rank 0's."""
        return self.trainer is None or self.trainer.is_global_zero

    def _file(self, stage: str) -> str | None:
        return self.hparams[f"{stage}_file"]

    @cached_property
    def _read(self) -> dict[str, tuple[list[str], list[str], list[int]]]:
        """Each file's (texts, labels, rows kept): empty texts refused, or left out with data.drop_empty."""
        hp, files = self.hparams, {}
        for stage in STAGES:
            if not (file := self._file(stage)):
                continue
            texts, labels = read_text_file(file, hp.text_column, hp.label_column, f"data.{stage}_file")
            empty = [row for row, text in enumerate(texts) if not text.strip()]
            where = f"data.{stage}_file={file} has {len(empty)} empty text(s) in column {hp.text_column}"
            if empty and not hp.drop_empty:
                raise ValueError(
                    f"{where} (the first in data row {empty[0] + 1}); fill or remove them, or set "
                    "data.drop_empty=true to leave them out"
                )
            if empty:
                log.warning(f"{where}: left out (data.drop_empty=true)")
            dropped = set(empty)
            files[stage] = (texts, labels, [row for row in range(len(texts)) if row not in dropped])
        return files

    def _tokens(self, stage: str, write: bool) -> tuple[dict[str, Any], list[str], list[int]]:
        """The file's token ids (every row, from the cache when it has them), its labels and the rows kept."""
        texts, labels, keep = self._read[stage]
        hp = self.hparams
        tokens = cached_tokens(self._file(stage), texts, self.tokenizer, hp.text_column, hp.cache_dir, write)
        return tokens, [labels[row] for row in keep], keep

    def _class_names(self, labels: list[str]) -> list[str]:
        """`class_names` if given; else "0" .. for integer labels, or the training file's sorted label names."""
        hp = self.hparams
        if hp.class_names is not None:
            return [str(name) for name in hp.class_names]
        found = sorted(set(labels))
        if all(is_index(label) for label in found):
            return [str(i) for i in range(hp.num_classes)]
        if len(found) != hp.num_classes:
            shown = ", ".join(found[:20]) + (", ..." if len(found) > 20 else "")
            raise ValueError(
                f"data.num_classes={hp.num_classes} but data.train_file={hp.train_file} has {len(found)} labels "
                f"({shown}); set data.num_classes={len(found)}, or list every class in data.class_names"
            )
        return found

    def _indices(self, stage: str, labels: list[str], names: list[str]) -> list[int]:
        """Each label's class index: its position in `names`, or the label itself when it is an index."""
        index = {name: i for i, name in enumerate(names)}
        indices = []
        for row, label in enumerate(labels):
            if label in index:
                indices.append(index[label])
            elif is_index(label) and int(label) < len(names):
                indices.append(int(label))
            else:
                shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
                source = "data.class_names" if self.hparams.class_names is not None else "the training labels"
                raise ValueError(
                    f"data.{stage}_file={self._file(stage)}, data row {self._read[stage][2][row] + 1}: label "
                    f"{label!r} is not a class; the classes ({source}) are {shown}, or their indices "
                    f"0..{len(names) - 1} (data.num_classes={self.hparams.num_classes})"
                )
        return indices

    def _split(self, labels: list[int], has_own: set[str]) -> dict[str, list[int]]:
        """The training file's rows (positions in `labels`) of each stage: train, and val and test when they
        have no file of their own, drawn by `split` and `split_seed`, stratified by class."""
        shares = list(self.hparams.split)
        for i, stage in enumerate(STAGES):
            if stage in has_own and shares[i]:
                fixed = [0 if STAGES[j] in has_own else share for j, share in enumerate(shares)]
                raise ValueError(
                    f"data.split={shares} draws a {stage} share from data.train_file, but data.{stage}_file is "
                    f"set; give it 0, e.g. data.split={fixed}"
                )
        total = len(labels)
        if all(isinstance(share, int) for share in shares):
            if sum(shares) != total:
                raise ValueError(f"data.split={shares} must sum to the {total} texts of data.train_file")
            sizes = shares
        else:
            if abs(sum(shares) - 1.0) > 1e-6 or min(shares) < 0:
                raise ValueError(f"data.split={shares}: fractions must be at least 0 and sum to 1.0")
            sizes = [int(share * total) for share in shares]
            sizes[0] += total - sum(sizes)  # rounding leftovers go to train
        parts = assign_parts(sizes, self.hparams.split_seed, labels).tolist()
        return {stage: [row for row, part in enumerate(parts) if part == i] for i, stage in enumerate(STAGES)}


def is_index(label: str) -> bool:
    return label.isdigit()


def lengths_of(dataset: Dataset) -> list[int]:
    """Each sample's token count (after truncation), through Subsets (the folds)."""
    if isinstance(dataset, Subset):
        lengths = lengths_of(dataset.dataset)
        return [lengths[i] for i in dataset.indices]
    return dataset.lengths.tolist()
