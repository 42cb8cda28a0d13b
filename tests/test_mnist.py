"""data=mnist: the full MNIST via torchvision, read from IDX files the test writes (no download here)."""

import struct
from pathlib import Path

import numpy as np
import pytest

from src.data.mnist_datamodule import MNISTDataModule


def write_idx(raw: Path, prefix: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Write MNIST's IDX format: big-endian magic, sizes, then uint8 data."""
    n, rows, cols = images.shape
    (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
        struct.pack(">IIII", 2051, n, rows, cols) + images.tobytes()
    )
    (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())


def write_test_data(data_dir: Path) -> list[str]:
    """data=mnist offline, for tests that run every data option (tests/test_data.py): 60 training and 20
    test digits as the four IDX files where torchvision looks, and the split that fits them."""
    raw = data_dir / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, count in (("train", 60), ("t10k", 20)):
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        write_idx(raw, prefix, images, np.arange(count, dtype=np.uint8) % 10)
    return ["data.split=[50,10]"]


def test_mnist_reads_the_four_idx_files(tmp_path: Path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    write_idx(
        raw, "train", rng.integers(0, 256, (60, 28, 28), dtype=np.uint8), np.arange(60, dtype=np.uint8) % 10
    )
    write_idx(
        raw, "t10k", rng.integers(0, 256, (20, 28, 28), dtype=np.uint8), np.arange(20, dtype=np.uint8) % 10
    )
    dm = MNISTDataModule(
        data_dir=str(tmp_path),
        num_classes=10,
        input_shape=[1, 28, 28],
        split=[50, 10],
        download=False,
        batch_size=10,
    )
    dm.prepare_data()
    dm.setup()
    assert (len(dm.data_train), len(dm.data_val), len(dm.data_test)) == (50, 10, 20)
    assert next(iter(dm.test_dataloader()))[1].tolist() == list(range(10))


def test_missing_mnist_names_where_to_put_the_files(tmp_path: Path):
    dm = MNISTDataModule(
        data_dir=str(tmp_path), num_classes=10, input_shape=[1, 28, 28], split=[50, 10], download=False
    )
    with pytest.raises(FileNotFoundError, match=r"MNIST is not in .*MNIST/raw.*train-images-idx3-ubyte"):
        dm.prepare_data()
