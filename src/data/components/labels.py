"""Which image has which label: read from a label file (CSV) or from class folders, and mapped to indices.

Every problem is reported with where it is (file and line, or folder), what was found and what is valid,
before any image is decoded.
"""

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from src.data.components.images import IMAGE_EXTENSIONS

# What each key that names a label file or a class-folder root must point at, for the error when it does not.
_CSV = "a CSV with one `image,label` line per image"
_FOLDER = "a folder with one folder of images per class"
EXPECTED = {
    "label_file": f"point data.image_dir at your images and data.label_file at {_CSV}",
    "val_label_file": f"give {_CSV}, or null to draw the validation images from data.label_file by data.split",
    "test_label_file": f"give {_CSV}, or null to draw the test images from data.label_file by data.split",
    "image_dir": f"give {_FOLDER}",
    "val_dir": f"give {_FOLDER}, or null to draw the validation images from data.image_dir by data.split",
    "test_dir": f"give {_FOLDER}, or null to draw the test images from data.image_dir by data.split",
}


@dataclass(frozen=True)
class Sample:
    """One labelled image, and where it was listed (for error messages)."""

    path: Path
    label: str
    source: str  # "labels.csv, line 7" or the class folder


def read_label_file(
    label_file: str | Path,
    image_dir: str | Path,
    image_column: int | str = 0,
    label_column: int | str = 1,
    header: bool | str = "auto",
    key: str = "label_file",
) -> list[Sample]:
    """The samples of a CSV label file; image names are relative to `image_dir` unless absolute.

    `header`: true, false, or "auto" (the first row is a header when its image field is not an image file
    name). Columns are 0-based indices, or header names when the file has a header. `key`: the config key
    that names the file (label_file, val_label_file, test_label_file), for the errors.
    """
    label_file = Path(label_file)
    if not label_file.is_file():
        raise FileNotFoundError(f"data.{key}={label_file} does not exist; {EXPECTED[key]}")
    with open(label_file, newline="") as file:
        rows = [
            (reader_line, row) for reader_line, row in _numbered_rows(file) if any(f.strip() for f in row)
        ]
    if not rows:
        raise ValueError(f"data.{key}={label_file} is empty; it needs one `image,label` line per image")
    first = rows[0][1]
    if header == "auto":
        column = image_column if isinstance(image_column, int) else 0
        header = isinstance(image_column, str) or (
            column < len(first) and not first[column].strip().lower().endswith(IMAGE_EXTENSIONS)
        )
    if header not in (True, False):
        raise ValueError(f"data.header={header} is not valid; choose true, false or auto")
    names = [name.strip() for name in first] if header else []
    image_index = _column_index(image_column, names, label_file, "image_column")
    label_index = _column_index(label_column, names, label_file, "label_column")
    needed = max(image_index, label_index) + 1
    samples = []
    for line, row in rows[1:] if header else rows:
        where = f"{label_file}, line {line}"
        if len(row) < needed:
            raise ValueError(
                f"{where}: expected at least {needed} comma-separated fields (image, label), found "
                f"{len(row)}: {','.join(row)!r}"
            )
        image, label = row[image_index].strip(), row[label_index].strip()
        if not image or not label:
            raise ValueError(f"{where}: the image name or the label is empty: {','.join(row)!r}")
        samples.append(Sample(Path(image_dir) / image, label, where))
    return samples


def scan_class_folders(root: str | Path, key: str = "image_dir") -> list[Sample]:
    """The images of `root/<class name>/<image>` (any depth below the class folder), labelled by folder.

    `key`: the config key that names `root` (image_dir, val_dir, test_dir), for the errors."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"data.{key}={root} does not exist; {EXPECTED[key]}")
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        raise ValueError(
            f"data.{key}={root} has no class folders; data.layout=class_folders expects {root}/<class>/<image>"
        )
    return [
        Sample(path, class_dir.name, str(class_dir))
        for class_dir in class_dirs
        for path in sorted(class_dir.rglob("*"))
        if path.suffix.lower() in IMAGE_EXTENSIONS
    ]


class ClassIndex:
    """Maps label text to class indices: by name in `names`, or as an integer index below `len(names)`."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self._index = {name: i for i, name in enumerate(self.names)}

    @classmethod
    def infer(
        cls, samples: Sequence[Sample], num_classes: int, class_names: Sequence[str] | None
    ) -> "ClassIndex":
        """`class_names` if given; else 0..num_classes-1 for integer labels, or the sorted label names."""
        if class_names is not None:
            if len(class_names) != num_classes:
                raise ValueError(
                    f"data.class_names has {len(class_names)} names but data.num_classes={num_classes}; "
                    "give one name per class, in class-index order"
                )
            return cls([str(name) for name in class_names])
        labels = sorted({sample.label for sample in samples})
        if all(_is_int(label) for label in labels):
            return cls([str(i) for i in range(num_classes)])
        if len(labels) != num_classes:
            shown = ", ".join(labels[:20]) + (", ..." if len(labels) > 20 else "")
            raise ValueError(
                f"data.num_classes={num_classes} but the training labels name {len(labels)} classes "
                f"({shown}); set data.num_classes={len(labels)}, or list every class in data.class_names"
            )
        return cls(labels)

    def __call__(self, sample: Sample) -> int:
        if sample.label in self._index:
            return self._index[sample.label]
        if _is_int(sample.label) and 0 <= int(sample.label) < len(self.names):
            return int(sample.label)
        shown = ", ".join(self.names[:20]) + (", ..." if len(self.names) > 20 else "")
        raise ValueError(
            f"{sample.source}: unknown class {sample.label!r} for {sample.path.name}; the classes are "
            f"{shown} (or their indices 0..{len(self.names) - 1}), taken from the training labels or data.class_names"
        )


def check_images_exist(samples: Sequence[Sample]) -> None:
    """Every listed image must be a file: checked before training, so a typo fails in seconds."""
    missing = [sample for sample in samples if not sample.path.is_file()]
    if missing:
        first = missing[0]
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise FileNotFoundError(
            f"{first.source}: image {first.path} does not exist{more}; check data.image_dir and the label file"
        )


def _numbered_rows(file) -> list[tuple[int, list[str]]]:
    reader = csv.reader(file)
    return [(reader.line_num, row) for row in reader]


def _column_index(column: int | str, names: list[str], label_file: Path, key: str) -> int:
    if isinstance(column, int):
        if column < 0:
            raise ValueError(f"data.{key}={column} must be a column index from 0, or a header name")
        return column
    if not names:
        raise ValueError(f"data.{key}={column} names a column, but {label_file} has no header; use an index")
    if column not in names:
        raise ValueError(
            f"data.{key}={column} is not a column of {label_file}; its columns are {', '.join(names)}"
        )
    return names.index(column)


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()
