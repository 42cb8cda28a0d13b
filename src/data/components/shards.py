"""The shard format that `python src/shard.py` writes and data=streaming reads: one folder (or URL prefix) with

    train/, val/, test/   each split of a data option as litdata.optimize writes it: index.json + chunk files
    shards.json           written last, and alone says the shards are finished: what they hold (src/sharding.py)
    shards.partial        written first and removed last: a folder with it but without shards.json is this
                          command's own half-written output, which it writes again from scratch

The splits are those of the data option after its `setup()`, so folds and drawn splits are what a run on the
option itself would train on. A dataset that reads image files (one with `to_shard(index)` and
`from_shard(sample)`: ImageDataset, the segmentation folder's) is stored as the files' bytes, which
data=streaming decodes and transforms with the option's own transforms (`encoding: files`); any other dataset
as the tensors its items are (`encoding: tensors`).
"""

import json
import logging
import shutil
import warnings
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

from src.common.files import write_atomically

FORMAT = 1
SPLITS = ("train", "val", "test")
FACTS_FILE = "shards.json"
PARTIAL_FILE = "shards.partial"


@cache
def litdata() -> ModuleType:
    """The litdata package, imported when shards are written or read (it takes seconds to import)."""
    try:
        import litdata
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            'data=streaming and src/shard.py need litdata: pip install -e ".[streaming]"'
        ) from err
    # Left out of a run's output, what litdata and Lightning say at every loader that no run can act on:
    # litdata's INFO lines about its reader and cache; its warning that drop_last is off under DDP (here only
    # validation and test loaders have it off, and their steps run no collectives: metrics sync once an epoch);
    # Lightning's, that an IterableDataset's length may be wrong with workers (litdata deals chunks to them).
    logging.getLogger("litdata").setLevel(logging.WARNING)
    logging.getLogger("litdata.streaming.dataset").addFilter(
        lambda record: "disabled the `drop_last` option" not in record.getMessage()
    )
    warnings.filterwarnings("ignore", r"Your `IterableDataset` has `__len__` defined")
    # And torch's, that a tensor read from a chunk is a view of a read-only buffer: collate copies it into a batch.
    warnings.filterwarnings("ignore", r"The given buffer is not writable", UserWarning)
    import src.data.components.object_store  # noqa: F401 - litdata then moves s3:// files with boto3 (see there)

    return litdata


def remote_options(location: str, options: Any, key: str) -> dict[str, Any]:
    """litdata's `storage_options` for shards at `location`, from the config's `options` (at `key`): {} for a
    local folder; for a URL, checked (no secrets in a config, only options its client takes)."""
    from src.data.components.object_store import storage_options

    return storage_options(location, options, key)


def open_folder(location: str, key: str, options: dict[str, Any] | None = None) -> "Folder":
    """The shards' folder at `location` (a local path, or an s3:// URL reached with the storage `options`):
    checked reachable first for a URL, so a missing bucket or credentials fail here in one line, not in litdata's
    retries. `key` is the config key that names it, for error messages."""
    from src.data.components.object_store import check_reachable, is_remote

    if not is_remote(location):
        return Folder(location, key)
    if not location.startswith("s3://"):
        raise ValueError(
            f"{key}={location}: shards in object storage are read and written at s3:// URLs (AWS, or any "
            "S3-compatible store: Google Cloud Storage, MinIO, R2, through AWS_ENDPOINT_URL); see docs/streaming.md"
        )
    check_reachable(location, key, options)
    return BucketFolder(location, key, options or {})


class Folder:
    """The few file operations the format needs, on a local folder."""

    def __init__(self, location: str, key: str) -> None:
        self.location, self.path = location, Path(location)
        self.key = key  # the config key that names the folder, for error messages

    def exists(self) -> bool:
        return self.path.is_dir()

    def names(self) -> list[str]:
        return sorted(entry.name for entry in self.path.iterdir()) if self.exists() else []

    def read_text(self, name: str) -> str | None:
        path = self.path / name
        return path.read_text() if path.is_file() else None

    def write_json(self, name: str, content: Any) -> None:
        """Written whole, then renamed into place: a reader never finds half a file."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path / name, json.dumps(content, indent=1) + "\n")

    def remove(self, name: str) -> None:
        path = self.path / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)

    def sizes(self, name: str) -> dict[str, int]:
        """The size of each file in the subfolder `name`, by file name."""
        folder = self.path / name
        files = folder.iterdir() if folder.is_dir() else ()
        return {file.name: file.stat().st_size for file in files if file.is_file()}

    def read_json(self, name: str) -> Any:
        """The JSON file `name`, or None when there is none; an error naming it when it does not parse."""
        text = self.read_text(name)
        if text is None:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{self.key}={self.location}: {name} is damaged ({err}); write the shards again with src/shard.py"
            ) from err


class BucketFolder(Folder):
    """The same operations on an s3:// prefix, with boto3 (an object is written whole, or not at all)."""

    def __init__(self, location: str, key: str, options: dict[str, Any]) -> None:
        import boto3

        self.location, self.key = location, key
        url = urlparse(location)
        self.bucket, self.prefix = url.netloc, url.path.strip("/")
        self.client = boto3.client("s3", **options)

    def object_key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def listed(self, name: str = "", delimiter: str = "") -> Iterator[dict[str, Any]]:
        """The pages of objects under `name` (everything under the prefix when empty)."""
        under = self.object_key(name).rstrip("/") + "/" if (self.prefix or name) else ""
        pages = self.client.get_paginator("list_objects_v2")
        yield from pages.paginate(Bucket=self.bucket, Prefix=under, Delimiter=delimiter)

    def exists(self) -> bool:
        return bool(self.names())  # object storage has no folders: a prefix exists when something is under it

    def names(self) -> list[str]:
        found = set()
        for page in self.listed(delimiter="/"):
            found |= {
                entry["Prefix"].rstrip("/").rsplit("/", 1)[-1] for entry in page.get("CommonPrefixes", [])
            }
            found |= {entry["Key"].rsplit("/", 1)[-1] for entry in page.get("Contents", [])}
        return sorted(found)

    def read_text(self, name: str) -> str | None:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.object_key(name))["Body"]
        except self.client.exceptions.NoSuchKey:
            return None
        return body.read().decode()

    def write_json(self, name: str, content: Any) -> None:
        body = (json.dumps(content, indent=1) + "\n").encode()
        self.client.put_object(Bucket=self.bucket, Key=self.object_key(name), Body=body)

    def remove(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.object_key(name))
        for page in self.listed(name):
            for entry in page.get("Contents", []):
                self.client.delete_object(Bucket=self.bucket, Key=entry["Key"])

    def sizes(self, name: str) -> dict[str, int]:
        return {
            entry["Key"].rsplit("/", 1)[-1]: entry["Size"]
            for page in self.listed(name, delimiter="/")
            for entry in page.get("Contents", [])
        }


# --- reading (data=streaming) ---


def read_facts(location: str, key: str = "data.input_dir", options: Any = None) -> dict[str, Any]:
    """What the finished shards at `location` hold (their shards.json); an error naming `key` and the fix when
    there are none, or they are not finished. `options`: litdata's storage options for a URL."""
    folder = open_folder(location, key, remote_options(location, options, "data.storage_options"))
    write = f"python src/shard.py data=<option> output_dir={location}"
    if not folder.exists():
        raise FileNotFoundError(f"{key}={location} does not exist; write shards there first: {write}")
    facts = folder.read_json(FACTS_FILE)
    if facts is None:
        names = folder.names()
        if not names:
            raise ValueError(f"{key}={location} is empty; write shards there first: {write}")
        if PARTIAL_FILE in names:
            raise ValueError(
                f"{key}={location} is not finished (it has no {FACTS_FILE}: src/shard.py stopped while writing "
                "it): run the shard command again, with the same output_dir"
            )
        raise ValueError(
            f"{key}={location} holds no {FACTS_FILE}, so src/shard.py did not write it; give the output_dir of a "
            f"shard command, or write shards there first: {write}"
        )
    if facts.get("format") != FORMAT:
        raise ValueError(
            f"{key}={location} holds shards of format {facts.get('format')}, this project reads format {FORMAT}: "
            "write them again with src/shard.py"
        )
    return facts


def check_chunks(
    location: str, facts: dict[str, Any], key: str = "data.input_dir", options: Any = None
) -> None:
    """An error naming the damaged file when a split's index or a chunk file is missing or not the size its
    index says (a copy that stopped halfway, a truncated download), before any batch is read."""
    folder = open_folder(location, key, remote_options(location, options, "data.storage_options"))
    for split in SPLITS:
        check_split(folder, split, facts)


def check_split(folder: Folder, split: str, facts: dict[str, Any]) -> None:
    key, location = folder.key, folder.location
    again = f"copy the shards again, or write them again with src/shard.py (output_dir={location})"
    index = folder.read_json(f"{split}/index.json")
    if index is None:
        raise FileNotFoundError(f"{key}={location}: {split}/index.json is missing; {again}")
    samples = sum(chunk["chunk_size"] for chunk in index["chunks"])
    if samples != facts["samples"][split]:
        raise ValueError(
            f"{key}={location}: {split}/index.json lists {samples} samples but {FACTS_FILE} says "
            f"{facts['samples'][split]}; {again}"
        )
    sizes = folder.sizes(split)  # one listing, not one request a chunk
    for chunk in index["chunks"]:
        size = sizes.get(chunk["filename"])
        if size != chunk["chunk_bytes"]:
            found = "missing" if size is None else f"{size} bytes instead of {chunk['chunk_bytes']}"
            raise ValueError(
                f"{key}={location}: chunk {split}/{chunk['filename']} is damaged ({found}); {again}"
            )
