"""Write the bundled MNIST digits as a folder of PNG files with labels: an example of `data=image_folder`.

    python scripts/make_example_images.py                         # data/mnist_images/ (label files)
    python scripts/make_example_images.py --layout class_folders  # data/mnist_images/{train,test}/<class>/
    python src/train.py experiment=mnist_images                   # train the CNN on it

The 5,000 digits of data=mnist5k (no download) become grayscale PNGs of mixed sizes (28 to 40 pixels, so the
resizing of the transforms has work to do), labelled with class names ("zero" ... "nine"): 4,500 in
train.csv (train + validation) and 500 in test.csv, or the same split as class folders. Nothing is
overwritten: an existing output folder is refused.
"""

import argparse
import csv
from pathlib import Path

import numpy as np
from PIL import Image

from src.data.mnist5k_datamodule import load_mnist5k

ROOT = Path(__file__).resolve().parents[1]
CLASS_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "data" / "mnist_images", help="output folder (new)"
    )
    parser.add_argument(
        "--data-dir", type=Path, default=ROOT / "data", help="where data=mnist5k caches its digits"
    )
    parser.add_argument("--layout", choices=["label_file", "class_folders"], default="label_file")
    parser.add_argument("--count", type=int, default=5000, help="how many digits to write (at most 5000)")
    parser.add_argument("--test", type=int, default=500, help="how many of them form the test set")
    parser.add_argument("--min-size", type=int, default=28, help="smallest image side in pixels")
    parser.add_argument("--max-size", type=int, default=40, help="largest image side in pixels")
    parser.add_argument(
        "--seed", type=int, default=0, help="fixes which digits are test digits and the sizes"
    )
    args = parser.parse_args()
    if args.out.exists():
        parser.error(f"{args.out} already exists; remove it or choose another --out")
    if not 0 < args.test < args.count <= 5000:
        parser.error(f"need 0 < --test ({args.test}) < --count ({args.count}) <= 5000")
    if not 1 <= args.min_size <= args.max_size:
        parser.error(f"need 1 <= --min-size ({args.min_size}) <= --max-size ({args.max_size})")

    images, labels = load_mnist5k(args.data_dir / "mnist5k" / "mnist_5k.npz")
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(labels))[: args.count]
    sizes = rng.integers(args.min_size, args.max_size + 1, size=args.count)
    rows: dict[str, list[tuple[str, str]]] = {"train": [], "test": []}
    for position, (index, size) in enumerate(zip(order, sizes, strict=True)):
        split = "test" if position < args.test else "train"
        name = CLASS_NAMES[labels[index]]
        if args.layout == "class_folders":
            path = args.out / split / name / f"{index:05d}.png"
        else:
            path = args.out / "images" / f"{index:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[index]).resize((int(size), int(size)), Image.BILINEAR).save(path)
        rows[split].append((path.name, name))
    if args.layout == "label_file":
        for split, split_rows in rows.items():
            with open(args.out / f"{split}.csv", "w", newline="") as file:
                writer = csv.writer(file)
                writer.writerow(["image", "label"])
                writer.writerows(sorted(split_rows))
    print(
        f"Wrote {args.count} PNG digits to {args.out} ({args.layout}: {len(rows['train'])} train, {args.test} test)"
    )


if __name__ == "__main__":
    main()
