"""The bag-of-words baseline of a text classification split: word counts and logistic regression.

    python scripts/text_baseline.py                      # the example: data/example_texts/ (written if missing)
    python scripts/text_baseline.py --train my/train.csv --test my/test.csv --text-column review

It fits scikit-learn's CountVectorizer (words and their counts, order lost) and LogisticRegression on the
training file and prints the accuracy on the test file: the score a model that reads word order must beat.
The example (src/data/components/example_texts.py) is built so that word order decides many labels.
"""

import argparse
from pathlib import Path

from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from src.data.components.example_texts import make_example_texts
from src.data.components.text_files import read_text_file

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    """Fit and score the baseline on the files the arguments name (`argv`: sys.argv[1:] when None)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=Path, help="training file (default: the example's train.csv)")
    parser.add_argument("--test", type=Path, help="test file (default: the example's test.csv)")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--label-column", default="label")
    args = parser.parse_args(argv)
    if args.train is None or args.test is None:
        example = make_example_texts(ROOT / "data" / "example_texts", exist_ok=True)
        args.train, args.test = args.train or example / "train.csv", args.test or example / "test.csv"
    columns = (args.text_column, args.label_column)
    train_texts, train_labels = read_text_file(args.train, *columns, key="--train")
    test_texts, test_labels = read_text_file(args.test, *columns, key="--test")
    model = make_pipeline(CountVectorizer(), LogisticRegression(max_iter=1000))
    model.fit(train_texts, train_labels)
    accuracy = model.score(test_texts, test_labels)
    print(
        f"bag-of-words logistic regression: test accuracy {accuracy:.4f} ({len(test_texts)} texts of {args.test})"
    )


if __name__ == "__main__":
    main()
