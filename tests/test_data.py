"""The datamodules: fixed splits, batch size split across devices, and clear errors for bad input."""

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate

from src import api
from src.data.datamodule import split_batch_size
from src.data.digits_datamodule import DigitsDataModule
from src.data.mnist5k_datamodule import MNIST5kDataModule
from tests.conftest import CONFIG_DIR, last_metrics, paths

DATA_OPTIONS = sorted(p.stem for p in (CONFIG_DIR / "data").glob("*.yaml"))
DEBUG_PRESETS = sorted(p.stem for p in (CONFIG_DIR / "debug").glob("*.yaml"))
# What a data option needs besides the default config to be built (not set up) here: the keys it leaves to the
# user, or takes from a model option other than the default one.
BUILD_WITH: dict[str, list[str]] = {}
# part: text
# The net's tokenizer (a text model's key): given to the data directly. Built, the example writes its folder.
BUILD_WITH["text_file"] = ["data.train_file=texts.csv", "data.tokenizer=tokenizer"]
BUILD_WITH["example_texts"] = ["data.tokenizer=${paths.data_dir}/example_texts/tokenizer"]
# /part


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
    dm = DigitsDataModule(str(data_dir), 10, [1, 8, 8], [1297, 250, 250], batch_size=32)
    dm.setup()
    assert len(dm.data_train) + len(dm.data_val) + len(dm.data_test) == 1797
    assert next(iter(dm.val_dataloader()))[0].shape == (32, 1, 8, 8)


def loader_batches(datamodule, epochs: int = 2) -> list[list[torch.Tensor]]:
    """Every batch of the train loader over `epochs` epochs, then of the val loader."""
    loader = datamodule.train_dataloader()
    batches = []
    for epoch in range(epochs):
        loader.batch_sampler.sampler.set_epoch(epoch)
        batches += [list(batch) for batch in loader]
    return batches + [list(batch) for batch in datamodule.val_dataloader()]


@pytest.mark.parametrize(("loading", "workers"), [("batches", 0), ("batches", 2), ("device", 0)])
def test_in_memory_batches_are_the_sample_by_sample_loaders_batches_in_the_same_order(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, loading: str, workers: int
):
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")  # the run's seed, which the shuffling follows
    settings = {"split": [1297, 250, 250], "batch_size": 100}
    reference = DigitsDataModule(str(data_dir), 10, [1, 8, 8], loading="samples", **settings)
    fast = DigitsDataModule(str(data_dir), 10, [1, 8, 8], loading=loading, num_workers=workers, **settings)
    for datamodule in (reference, fast):
        datamodule.setup("fit")
    expected, got = loader_batches(reference), loader_batches(fast)
    assert len(got) == len(expected) == 2 * 13 + 3  # 1297 / 100 per epoch, then 250 / 100
    for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_batches_need_tensor_datasets():
    from src.data.in_memory_datamodule import tensors_of

    with pytest.raises(
        TypeError, match=r"data.loading=batches needs tensor datasets, but this split is a list"
    ):
        tensors_of([(torch.zeros(1), 0)])


def test_a_bad_loading_is_refused(data_dir: Path):
    with pytest.raises(ValueError, match=r"data.loading=fast is not one of samples, batches, device"):
        DigitsDataModule(str(data_dir), 10, [1, 8, 8], [1297, 250, 250], loading="fast")
    with pytest.raises(ValueError, match=r"data.loading=device .* needs data.num_workers=0"):
        DigitsDataModule(str(data_dir), 10, [1, 8, 8], [1297, 250, 250], loading="device", num_workers=2)


def test_global_batch_size_is_split_across_devices():
    assert split_batch_size(64, 2) == 32
    with pytest.raises(
        ValueError, match=r"data.batch_size=100 is not divisible by 3 devices; choose a multiple of 3"
    ):
        split_batch_size(100, 3)
    # A batch size below 1 preflight refuses (tests/test_bad_input.py).


def test_a_split_that_does_not_fit_the_dataset_is_refused(data_dir: Path):
    dm = DigitsDataModule(str(data_dir), 10, [1, 8, 8], split=[1000, 100, 100])
    with pytest.raises(
        ValueError, match=r"data.split=\[1000, 100, 100\] does not fit digits, which has 1797"
    ):
        dm.setup()


def test_wrong_input_shape_is_refused(data_dir: Path):
    dm = DigitsDataModule(str(data_dir), 10, [1, 28, 28], [1297, 250, 250])
    with pytest.raises(
        ValueError, match=r"data.input_shape=\[1, 28, 28\] but digits images have shape \[1, 8, 8\]"
    ):
        dm.setup()


def test_wrong_num_classes_is_refused(data_dir: Path):
    dm = DigitsDataModule(str(data_dir), 5, [1, 8, 8], [1297, 250, 250])
    with pytest.raises(ValueError, match=r"data.num_classes=5 but digits has 10 classes"):
        dm.setup()


# --- every debug preset with every data option ---


@pytest.mark.parametrize("option", DATA_OPTIONS)
@pytest.mark.parametrize("preset", DEBUG_PRESETS)
def test_every_debug_preset_composes_with_every_data_option_into_a_datamodule(compose_cfg, preset, option):
    cfg = compose_cfg("train", [f"debug={preset}", f"data={option}", *BUILD_WITH.get(option, [])])
    instantiate(cfg.data, _convert_="all")  # a key the datamodule does not take fails here


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
MODEL_FOR["example_texts"] = [
    "model=text_classifier",
    "model.net.tokenizer=${paths.data_dir}/example_texts/tokenizer",
]
# /part


@pytest.mark.slow
@pytest.mark.parametrize("option", DATA_OPTIONS)
def test_the_overfit_preset_trains_on_every_data_option(option: str, tmp_path: Path, data_dir: Path):
    write = data_writer(option)
    option_data_dir = tmp_path / "data" if write else data_dir  # the session's, with the mnist5k cache
    overrides = write(option_data_dir) if write else []
    run = api.train(
        [
            *paths(tmp_path / "logs", option_data_dir),
            "debug=overfit",
            f"data={option}",
            *MODEL_FOR.get(option, ["model/net=mlp"]),
            "trainer.max_epochs=2",
            *overrides,
        ]
    )
    assert run.run_dir.parent == tmp_path / "logs" / "debug" / "runs"  # a debug preset's run: in logs/debug/
    assert "train/acc" in last_metrics(run.run_dir)


def test_augment_false_turns_the_random_shift_off(data_dir: Path):
    images = torch.arange(64.0).view(1, 1, 8, 8).repeat(4, 1, 1, 1)
    for augment in (True, False):
        dm = DigitsDataModule(str(data_dir), 10, [1, 8, 8], [1297, 250, 250], random_shift=2, augment=augment)
        dm.trainer = SimpleNamespace(training=True)
        torch.manual_seed(0)
        shifted = [dm.on_after_batch_transfer([images, torch.zeros(4)], 0)[0] for _ in range(10)]
        assert any(not torch.equal(batch, images) for batch in shifted) == augment
