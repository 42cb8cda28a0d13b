"""k-fold cross-validation (`data.num_folds`, `data.fold`): folds that partition the train+val pool, stratified
by class, the same on every rank and run, validated without augmentation; the test split never moves."""

import logging
import re
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from torch.utils.data import Subset, TensorDataset

from src.data.datamodule import DataModule
from src.run.builder import complete_config
from tests.conftest import CONFIG_DIR

DIGITS = ["data=digits", "data.loading=samples"]  # samples: the splits stay Subsets, whose indices we compare
# What a data option needs besides the default config to be built (not set up) here: the keys it leaves to the
# user, or takes from a model option other than the default one.
BUILD_WITH: dict[str, list[str]] = {}
# part: text
# The net's tokenizer (a text model's key): given to the data directly. Built, the example writes its folder.
BUILD_WITH["text_file"] = ["data.train_file=texts.csv", "data.tokenizer=tokenizer"]
# /part


def datamodule(compose_cfg, *overrides: str, trainer: SimpleNamespace | None = None) -> DataModule:
    """The datamodule of `python src/train.py <overrides>`, set up for fit (by `trainer`'s rank, if given)."""
    cfg = compose_cfg("train", list(overrides))
    complete_config(cfg)  # as a run does: the keys the data fills in
    dm = instantiate(cfg.data, _convert_="all")
    dm.trainer = trainer
    dm.setup("fit")
    return dm


def indices(dataset: Subset) -> list[int]:
    """The indices of a (Subset of a ...) Subset in the dataset at the bottom."""
    inner = dataset.dataset
    return [inner.indices[i] for i in dataset.indices] if isinstance(inner, Subset) else list(dataset.indices)


def test_the_digits_folds_partition_the_pool_by_class_and_leave_the_test_split(compose_cfg):
    plain = datamodule(compose_cfg, *DIGITS)
    pool = indices(plain.data_train) + indices(plain.data_val)
    labels = plain.data_train.dataset.tensors[1]
    pool_counts = Counter(labels[pool].tolist())
    folds = [datamodule(compose_cfg, *DIGITS, "data.num_folds=5", f"data.fold={f}") for f in range(5)]
    val_sets = [indices(dm.data_val) for dm in folds]
    assert sorted(i for val in val_sets for i in val) == sorted(pool)  # disjoint, and together the whole pool
    for dm, val in zip(folds, val_sets, strict=True):
        assert sorted(indices(dm.data_train) + val) == sorted(pool)  # trains on the rest
        assert indices(dm.data_test) == indices(plain.data_test)  # the test split never moves
        counts = Counter(labels[val].tolist())
        assert all(abs(counts[c] - n / 5) < 1 for c, n in pool_counts.items()), counts


# part: segmentation
def test_the_digit_scenes_folds_partition_the_pool(compose_cfg):
    from tests.conftest import SMALL_SCENES

    scenes = ["data=digit_scenes", *SMALL_SCENES]
    plain = datamodule(compose_cfg, *scenes)
    folds = [datamodule(compose_cfg, *scenes, "data.num_folds=4", f"data.fold={f}") for f in range(4)]
    pool_size = len(plain.data_train) + len(plain.data_val)
    val_sets = [dm.data_val.indices for dm in folds]
    assert sorted(i for val in val_sets for i in val) == list(range(pool_size))
    for dm, val in zip(folds, val_sets, strict=True):
        assert sorted(dm.data_train.indices + val) == list(range(pool_size))
        pool = dm.data_val.dataset  # the train scenes, then the val scenes
        assert torch.equal(
            pool.tensors[0], torch.cat([plain.data_train.tensors[0], plain.data_val.tensors[0]])
        )
        assert torch.equal(dm.data_test.tensors[1], plain.data_test.tensors[1])


# /part


def test_a_fold_is_the_same_on_every_rank_and_after_a_resume(compose_cfg, monkeypatch: pytest.MonkeyPatch):
    """Only split_seed draws the folds: not the rank, the run's seed or the global random state (a resumed run
    sets the datamodule up again in a fresh process)."""
    overrides = [*DIGITS, "data.num_folds=3", "data.fold=1"]
    seen = []
    for rank, seed in ((0, 1), (1, 2)):
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        torch.manual_seed(seed)
        dm = datamodule(compose_cfg, *overrides, trainer=SimpleNamespace(world_size=2, global_rank=rank))
        seen.append((indices(dm.data_train), indices(dm.data_val)))
    assert seen[0] == seen[1]
    other = datamodule(compose_cfg, *overrides, "data.split_seed=7")
    assert indices(other.data_val) != seen[0][1]  # split_seed is what draws them


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.num_folds=1"], "data.num_folds=1 must be null (no folds) or at least 2"),
        (["data.num_folds=5", "data.fold=5"], "data.fold=5 is not a fold of data.num_folds=5; choose 0..4"),
        (["data.num_folds=5", "data.fold=-1"], "data.fold=-1 is not a fold of data.num_folds=5; choose 0..4"),
        (["data.fold=2"], "data.fold=2 needs folds: set data.num_folds (e.g. 5) for k-fold cross-validation"),
        (
            ["data.num_folds=2000"],
            "data.num_folds=2000 is more than the 1547 train+val samples of digits; choose 2..1547",
        ),
    ],
)
def test_bad_fold_settings_are_refused_naming_the_key(compose_cfg, overrides: list[str], message: str):
    with pytest.raises((ValueError, InstantiationException), match=re.escape(message)):
        datamodule(compose_cfg, "data=digits", *overrides)


def test_a_class_with_fewer_samples_than_folds_is_a_warning(compose_cfg, caplog: pytest.LogCaptureFixture):
    """Not an error: that class only misses from some validation folds."""
    with caplog.at_level(logging.WARNING):
        dm = datamodule(compose_cfg, "data=digits", "data.num_folds=160")
    assert "data.num_folds=160: digits has fewer samples than folds of class(es) {" in caplog.text
    assert len(dm.data_val) in (9, 10)


class _OwnDatasets(DataModule):
    """Train and val datasets of its own kind (lists): the base cannot tell whether they are prepared alike."""

    def load_datasets(self) -> tuple[list, list, TensorDataset]:
        sample = (torch.zeros(1, 8, 8), 0)
        return [sample] * 8, [sample] * 4, TensorDataset(torch.zeros(4, 1, 8, 8), torch.zeros(4))


def test_datasets_the_base_cannot_pool_safely_are_refused_naming_the_hook():
    dm = _OwnDatasets(input_shape=[1, 8, 8], num_folds=3)
    with pytest.raises(NotImplementedError, match=r"data.num_folds=3: .* override _OwnDatasets.fold_pool"):
        dm.setup("fit")


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONFIG_DIR / "data").glob("*.yaml")))
def test_every_data_option_takes_a_fold(compose_cfg, option: str):
    """What each job of `-m data.num_folds=3 data.fold='range(0,3)'` builds."""
    cfg = compose_cfg(
        "train", [f"data={option}", *BUILD_WITH.get(option, []), "data.num_folds=3", "data.fold=2"]
    )
    # part: streaming
    if option == "streaming":  # its shards hold one split: it names how to shard each fold instead
        with pytest.raises(
            InstantiationException, match=r"data.num_folds=3: data=streaming trains on the splits"
        ):
            instantiate(cfg.data, _convert_="all")
        return
    # /part
    instantiate(cfg.data, _convert_="all")
