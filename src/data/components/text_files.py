"""Texts and their labels from a table file: CSV, TSV, JSON lines or Parquet, chosen by the file's suffix.

Read with pyarrow (the text extra), the two columns as strings: a label column of integers reads as "0", "1",
..., which the datamodule maps to class indices.
"""

from pathlib import Path

FORMATS = {".csv": "CSV", ".tsv": "TSV", ".jsonl": "JSON lines", ".json": "JSON lines", ".parquet": "Parquet"}


def read_text_file(
    path: str | Path, text_column: str, label_column: str | None, key: str
) -> tuple[list[str], list[str]]:
    """The texts and labels of every row (a missing value reads as ""; no labels without `label_column`, as
    predict reads texts). `key` is the config key that names the file, for the errors."""
    import pyarrow as pa

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{key}={path} does not exist; give a {', '.join(FORMATS)} file")
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"{key}={path}: unknown format {suffix!r}; give a file ending in {', '.join(FORMATS)}"
        )
    try:
        columns = (text_column, label_column) if label_column is not None else (text_column,)
        table = _read_table(path, suffix, columns)
    except pa.ArrowInvalid as err:
        raise ValueError(
            f"{key}={path} is not a valid {FORMATS[suffix]} file: {str(err).splitlines()[0]}"
        ) from err
    for column, column_key in ((text_column, "data.text_column"), (label_column, "data.label_column")):
        if column is not None and column not in table.column_names:
            raise ValueError(
                f"{column_key}={column} is not a column of {key}={path}; its columns are "
                f"{', '.join(table.column_names)}"
            )
    texts, labels = (
        table.column(column).cast(pa.string()).to_pylist() if column is not None else []
        for column in (text_column, label_column)
    )
    return [text or "" for text in texts], ["" if label is None else label.strip() for label in labels]


def _read_table(path: Path, suffix: str, columns: tuple[str, ...]):
    """The file as a pyarrow Table; the CSV/TSV columns named in `columns` read as strings, not inferred."""
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path)
    if suffix in (".jsonl", ".json"):
        import pyarrow.json as pj

        return pj.read_json(path)
    import pyarrow as pa
    import pyarrow.csv as pc

    return pc.read_csv(
        path,
        parse_options=pc.ParseOptions(delimiter="\t" if suffix == ".tsv" else ",", newlines_in_values=True),
        convert_options=pc.ConvertOptions(
            column_types={column: pa.string() for column in columns}, strings_can_be_null=False
        ),
    )
