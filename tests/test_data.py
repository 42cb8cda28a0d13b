"""The datamodules: fixed splits, batch size split across devices, and clear errors for bad input."""

from pathlib import Path

import pytest
import torch

from src.data.classification_datamodule import split_batch_size
from src.data.digits_datamodule import DigitsDataModule
from src.data.mnist5k_datamodule import MNIST5kDataModule


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
    from src.data.in_memory_datamodule import _tensors

    with pytest.raises(
        TypeError, match=r"data.loading=batches needs tensor datasets, but this split is a list"
    ):
        _tensors([(torch.zeros(1), 0)])


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
    with pytest.raises(ValueError, match=r"data.batch_size=0 must be a positive integer"):
        split_batch_size(0, 1)


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
