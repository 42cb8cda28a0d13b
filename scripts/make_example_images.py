"""Write the bundled MNIST digits as a folder of PNG files with labels: an example of `data=image_folder`.

    python scripts/make_example_images.py                         # data/mnist_images/ (label files)
    python scripts/make_example_images.py --layout class_folders  # data/mnist_images/{train,test}/<class>/
    python src/train.py experiment=mnist_images                   # train the CNN on it

`experiment=mnist_images` writes data/mnist_images/ by itself when it is missing; this script writes the
folder elsewhere, or in the class-folder layout. The 5,000 digits of data=mnist5k (no download) become
grayscale PNGs of mixed sizes (28 to 40 pixels), labelled with class names ("zero" ... "nine"): 4,500 in
train.csv (train + validation) and 500 in test.csv, or the same split as class folders. Nothing is
overwritten: an existing output folder is refused. The writing is src/data/components/example_images.py.
"""

import argparse
from pathlib import Path

from src.data.components.example_images import LAYOUTS, make_example_images

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "data" / "mnist_images", help="output folder (new)"
    )
    parser.add_argument(
        "--data-dir", type=Path, default=ROOT / "data", help="where data=mnist5k caches its digits"
    )
    parser.add_argument("--layout", choices=LAYOUTS, default="label_file")
    parser.add_argument("--count", type=int, default=5000, help="how many digits to write (at most 5000)")
    parser.add_argument("--test", type=int, default=500, help="how many of them form the test set")
    parser.add_argument("--min-size", type=int, default=28, help="smallest image side in pixels")
    parser.add_argument("--max-size", type=int, default=40, help="largest image side in pixels")
    parser.add_argument(
        "--seed", type=int, default=0, help="fixes which digits are test digits and the sizes"
    )
    args = parser.parse_args()
    try:
        make_example_images(
            args.out,
            args.data_dir,
            layout=args.layout,
            count=args.count,
            test=args.test,
            min_size=args.min_size,
            max_size=args.max_size,
            seed=args.seed,
        )
    except (FileExistsError, ValueError) as err:
        parser.error(str(err))  # the options' names: test is --test, min_size is --min-size, ...
    print(
        f"Wrote {args.count} PNG digits to {args.out} ({args.layout}: {args.count - args.test} train, {args.test} test)"
    )


if __name__ == "__main__":
    main()
