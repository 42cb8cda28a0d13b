"""The datamodules: fixed splits, batch size split across devices, and clear errors for bad input."""

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from src import api
from src.data.datamodule import split_batch_size
from src.data.digits_datamodule import DigitsDataModule
from src.data.in_memory_datamodule import tensors_of
from src.data.mnist5k_datamodule import MNIST5kDataModule
from tests.conftest import CONFIG_DIR, last_metrics, paths

DIGITS = {"num_classes": 10, "input_shape": [1, 8, 8], "split": [1297, 250, 250]}


def test_mnist5k_has_a_fixed_4000_500_500_split_of_real_digits(data_dir: Path):
    first, second = (MNIST5kDataModule(str(data_dir), 10, [1, 28, 28], [4000, 500, 500]) for _ in range(2))
    for dm in (first, second):
        dm.prepare_data()
        dm.setup()
    assert (len(first.data_train), len(first.data_val), len(first.data_test)) == (4000, 500, 500)
    assert torch.equal(first.data_test.tensors[0], second.data_test.tensors[0])  # same split every run
    assert (data_dir / "mnist5k" / "mnist_5k.npz").exists()  # parsed once, then cached
    images, _ = next(iter(first.train_dataloader()))
    assert images.shape == (64, 1, 28, 28) and images.dtype == torch.float32
    assert set(torch.cat([y for _, y in first.test_dataloader()]).tolist()) == set(range(10))


def test_digits_datamodule_gives_8x8_images(data_dir: Path):
    dm = DigitsDataModule(str(data_dir), **DIGITS, batch_size=32)
    dm.setup()
    assert len(dm.data_train) + len(dm.data_val) + len(dm.data_test) == 1797
    assert next(iter(dm.val_dataloader()))[0].shape == (32, 1, 8, 8)


@pytest.mark.parametrize(("loading", "workers"), [("batches", 0), ("batches", 2), ("device", 0)])
def test_in_memory_batches_are_the_sample_by_sample_loaders_batches_in_the_same_order(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, loading: str, workers: int
):
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")  # the run's seed, which the shuffling follows

    def batches(**settings) -> list[list[torch.Tensor]]:
        """Every batch of two epochs of the train loader, then of the val loader."""
        dm = DigitsDataModule(str(data_dir), **DIGITS | {"batch_size": 100}, **settings)
        dm.setup("fit")
        loader, seen = dm.train_dataloader(), []
        for epoch in range(2):
            loader.batch_sampler.sampler.set_epoch(epoch)
            seen += [list(batch) for batch in loader]
        return seen + [list(batch) for batch in dm.val_dataloader()]

    expected, got = batches(loading="samples"), batches(loading=loading, num_workers=workers)
    assert len(got) == len(expected) == 2 * 13 + 3  # 1297 / 100 per epoch, then 250 / 100
    for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"loading": "fast"}, r"data.loading=fast is not one of samples, batches, device"),
        ({"loading": "device", "num_workers": 2}, r"data.loading=device .* needs data.num_workers=0"),
        ({"split": [1000, 100, 100]}, r"data.split=\[1000, 100, 100\] does not fit digits, which has 1797"),
        (
            {"input_shape": [1, 28, 28]},
            r"data.input_shape=\[1, 28, 28\] but digits images have shape \[1, 8, 8\]",
        ),
        ({"num_classes": 5}, r"data.num_classes=5 but digits has 10 classes"),
    ],
)
def test_bad_digits_settings_are_refused_naming_the_key(data_dir: Path, settings: dict, message: str):
    with pytest.raises(ValueError, match=message):
        DigitsDataModule(str(data_dir), **DIGITS | settings).setup()


def test_batches_need_tensor_datasets_and_the_batch_size_splits_evenly_across_devices():
    with pytest.raises(
        TypeError, match=r"data.loading=batches needs tensor datasets, but this split is a list"
    ):
        tensors_of([(torch.zeros(1), 0)])
    assert split_batch_size(64, 2) == 32
    with pytest.raises(
        ValueError, match=r"data.batch_size=100 is not divisible by 3 devices; choose a multiple of 3"
    ):
        split_batch_size(100, 3)
    # A batch size below 1 preflight refuses (tests/test_bad_input.py).


def test_augment_false_turns_the_random_shift_off(data_dir: Path):
    images = torch.arange(64.0).view(1, 1, 8, 8).repeat(4, 1, 1, 1)
    for augment in (True, False):
        dm = DigitsDataModule(str(data_dir), **DIGITS, random_shift=2, augment=augment)
        dm.trainer = SimpleNamespace(training=True)
        torch.manual_seed(0)
        shifted = [dm.on_after_batch_transfer([images, torch.zeros(4)], 0)[0] for _ in range(10)]
        assert any(not torch.equal(batch, images) for batch in shifted) == augment


def data_writer(option: str) -> Callable[[Path], list[str]] | None:
    """`write_test_data(data_dir) -> overrides` of tests/test_<option>.py, for a data option whose files no
    package ships (a download, your own images): it writes a small copy into data_dir. None: none needed."""
    module = f"tests.test_{option}"
    if importlib.util.find_spec(module) is None:
        return None
    return getattr(importlib.import_module(module), "write_test_data", None)


# The model a data option of another task than classification trains with (the classification options: the MLP).
MODEL_FOR: dict[str, list[str]] = {}
# part: segmentation
# The U-Net at its smallest: what is checked here is the data option, not the net.
SMALL_SEGMENTER = ["model=segmenter", "model.net.channels=[4,8]"]
MODEL_FOR |= {"digit_scenes": SMALL_SEGMENTER, "segmentation_folder": SMALL_SEGMENTER}
# /part
# part: text
MODEL_FOR["text_file"] = ["model=text_classifier"]  # from scratch, with the tokenizer write_test_data makes
MODEL_FOR["example_texts"] = ["model=text_classifier"]  # from scratch, with the example's own tokenizer
# /part


@pytest.mark.slow
@pytest.mark.parametrize("option", sorted(p.stem for p in (CONFIG_DIR / "data").glob("*.yaml")))
def test_the_overfit_preset_trains_on_every_data_option(option: str, tmp_path: Path, data_dir: Path):
    """Every data option with every key a debug preset sets (they all build on debug/default), end to end."""
    write = data_writer(option)
    option_data_dir = tmp_path / "data" if write else data_dir  # the session's, with the mnist5k cache
    overrides = [
        f"data={option}",
        *MODEL_FOR.get(option, ["model/net=mlp"]),
        *(write(option_data_dir) if write else []),
    ]
    run = api.train(
        [*paths(tmp_path / "logs", option_data_dir), "debug=overfit", "trainer.max_epochs=2", *overrides]
    )
    assert run.run_dir.parent == tmp_path / "logs" / "debug" / "runs"  # a debug preset's run: in logs/debug/
    assert "train/acc" in last_metrics(run.run_dir)
