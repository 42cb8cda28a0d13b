"""The example image folder: the bundled mnist5k digits written as PNG files with labels, offline, in seconds.

`experiment=mnist_images` builds it on first use (through ImageFolderDataModule's `prepare`), and
`python scripts/make_example_images.py` writes it anywhere. The images have mixed sizes (28 to 40 pixels, so
the transforms' resizing has work to do) and class-name labels ("zero" ... "nine").
"""

import csv
import logging
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from src.data.components.mnist5k_file import load_mnist5k

log = logging.getLogger(__name__)

CLASS_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
LAYOUTS = ("label_file", "class_folders")


def make_example_images(
    out: str | Path,
    data_dir: str | Path,
    layout: str = "label_file",
    count: int = 5000,
    test: int = 500,
    min_size: int = 28,
    max_size: int = 40,
    seed: int = 0,
    exist_ok: bool = False,
) -> Path:
    """Write `count` digits into `out`: `test` of them for testing, the rest for training (and validation).

    layout=label_file: out/images/<n>.png, out/train.csv and out/test.csv (`image,label` lines);
    layout=class_folders: out/{train,test}/<class name>/<n>.png. `seed` fixes which digits are test digits
    and the sizes. An existing `out` is kept as it is with `exist_ok` (a build on first use), else refused.
    The folder is written beside `out` and renamed at the end, so a run killed halfway leaves no half folder
    that a later run would take for complete.
    """
    out = Path(out)
    if out.exists():
        if exist_ok:
            return out
        raise FileExistsError(f"{out} already exists; remove it or choose another output folder")
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout} is not valid; choose {' or '.join(LAYOUTS)}")
    if not 0 < test < count <= 5000:
        raise ValueError(f"need 0 < test ({test}) < count ({count}) <= 5000 (the mnist5k digits)")
    if not 1 <= min_size <= max_size:
        raise ValueError(f"need 1 <= min_size ({min_size}) <= max_size ({max_size})")

    images, labels = load_mnist5k(Path(data_dir) / "mnist5k" / "mnist_5k.npz")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))[:count]
    sizes = rng.integers(min_size, max_size + 1, size=count)
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        _write(partial, layout, images[order], labels[order], order, sizes, test)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    try:
        partial.rename(out)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not (exist_ok and out.is_dir()):  # else another process (another node of the run) was first
            raise
        return out
    log.info(f"Wrote {count} PNG digits to {out} ({layout}: {count - test} train, {test} test)")
    return out


def _write(
    folder: Path,
    layout: str,
    images: np.ndarray,
    labels: np.ndarray,
    numbers: np.ndarray,
    sizes: np.ndarray,
    test: int,
) -> None:
    """The first `test` images are test images; file names are the digits' numbers in mnist5k."""
    rows: dict[str, list[tuple[str, str]]] = {"train": [], "test": []}
    for position, (image, label, number, size) in enumerate(zip(images, labels, numbers, sizes, strict=True)):
        split = "test" if position < test else "train"
        name, file_name = CLASS_NAMES[label], f"{number:05d}.png"
        parent = folder / split / name if layout == "class_folders" else folder / "images"
        parent.mkdir(parents=True, exist_ok=True)
        picture = Image.fromarray(image).resize((int(size), int(size)), Image.BILINEAR)
        # PNG is lossless at any compression level; level 1 writes 3x faster than the default.
        picture.save(parent / file_name, compress_level=1)
        rows[split].append((file_name, name))
    if layout == "label_file":
        for split, split_rows in rows.items():
            with open(folder / f"{split}.csv", "w", newline="") as file:
                writer = csv.writer(file)
                writer.writerow(["image", "label"])
                writer.writerows(sorted(split_rows))
