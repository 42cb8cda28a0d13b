"""Every file of an image dataset checked once, before training: a bad file fails the run in seconds with one
line naming it, instead of when a batch first reaches it, maybe hours in.

What "checked" means is the caller's `check` (decode an image; for segmentation also its mask's existence,
size and values). Samples that passed are remembered in a JSON file under `cache_dir`, by each file's path,
size and modification time, so the next run on unchanged files only stats them. The cache file's name hashes
the settings the check depends on (folders, class count, ...): other settings check again. Failures are never
cached, so a fixed file is checked anew and a broken one fails every time.
"""

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from PIL import Image

from src.data.components.image_dataset import UNREADABLE

log = logging.getLogger(__name__)

Files = tuple[Path, ...]  # the files checked together: an image, or an image and its mask
Stamp = list[list[int]]  # [size, mtime_ns] of each file of a sample


class BadFileError(RuntimeError):
    """A file that training would fail on; the message is one line that names it and what to do."""


def decode(path: Path, what: str, hint: str) -> Image.Image:
    """The image at `path` fully decoded (a truncated file, or text named .png, fails here, not mid-epoch)."""
    try:
        with Image.open(path) as image:
            image.load()
    except UNREADABLE as err:
        reason = " ".join(str(err).split())  # PIL's reason, kept on the one line
        raise BadFileError(f"cannot read {what} {path} ({reason}); {hint}") from err
    return image


def check_files(
    samples: Sequence[Files],
    check: Callable[[Files], None],
    name: str,
    noun: str,
    cache_dir: str | Path | None,
    settings: dict[str, Any],
    workers: int = 1,
    write_cache: bool = True,
) -> dict[Files, BadFileError]:
    """Run `check` (which raises BadFileError) on every sample not unchanged since it last passed; return the
    failures, in the order of `samples`.

    `name` and `noun` ("images", "image/mask pairs") word the one log line. `settings`: what else the check
    depends on. `workers` threads decode in parallel (PIL releases the GIL). `write_cache=False` reads the
    cache without writing it: under DDP every rank checks, one per node writes.
    """
    settings = json.loads(json.dumps(settings))  # as the cache stores them: tuples become lists
    cache_file = _cache_file(cache_dir, name, settings)
    passed = _read_cache(cache_file, settings)
    stamps = {sample: _stamp(sample) for sample in samples}
    todo = [
        sample for sample in samples if stamps[sample] is None or passed.get(_key(sample)) != stamps[sample]
    ]
    with ThreadPoolExecutor(max(1, workers)) as pool:
        outcomes = list(pool.map(lambda sample: _outcome(check, sample), todo))
    failures = {sample: error for sample, error in zip(todo, outcomes, strict=True) if error is not None}
    skipped = len(samples) - len(todo)
    cache = f"{skipped} skipped, unchanged since they passed: {cache_file}" if cache_file else "no cache"
    log.info(f"Checked {len(todo)} of {len(samples)} {noun} of {name} ({cache})")
    now_passed = {
        _key(sample): stamp
        for sample, stamp in stamps.items()
        if stamp is not None and sample not in failures
    }
    if cache_file is not None and write_cache and now_passed != passed:
        _write_cache(cache_file, settings, now_passed)
    return failures


def raise_first(failures: dict[Files, BadFileError]) -> None:
    """Raise the first failure; the others are logged, one line each, and counted in its message."""
    if not failures:
        return
    first, *others = failures.values()
    for error in others[:20]:
        log.error(str(error))
    if others:
        raise BadFileError(f"{first}; {len(others)} more bad file(s) logged above") from first
    raise first


def _outcome(check: Callable[[Files], None], sample: Files) -> BadFileError | None:
    try:
        check(sample)
    except BadFileError as error:
        return error
    return None


def _stamp(sample: Files) -> Stamp | None:
    """[size, mtime_ns] of each file; None when one is missing (then the sample is checked, and fails)."""
    try:
        return [[stat.st_size, stat.st_mtime_ns] for stat in map(os.stat, sample)]
    except OSError:
        return None


def _key(sample: Files) -> str:
    return "\t".join(str(Path(path).absolute()) for path in sample)


def _cache_file(cache_dir: str | Path | None, name: str, settings: dict[str, Any]) -> Path | None:
    if cache_dir is None:
        return None
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{name.replace(' ', '_')}_{digest}.json"


def _read_cache(cache_file: Path | None, settings: dict[str, Any]) -> dict[str, Stamp]:
    """The samples that passed last time, by key; nothing when there is no cache or it is unusable."""
    if cache_file is None or not cache_file.is_file():
        return {}
    try:
        cached = json.loads(cache_file.read_text())
    except (OSError, ValueError) as err:
        log.warning(f"ignoring the unreadable file-check cache {cache_file} ({err}); every file is checked")
        return {}
    return cached.get("passed", {}) if cached.get("settings") == settings else {}


def _write_cache(cache_file: Path, settings: dict[str, Any], passed: dict[str, Stamp]) -> None:
    """Written whole to a temporary file, then renamed: a reader (another rank, node or run) never sees half
    of it; of two writers, the last wins."""
    temporary = None
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=cache_file.parent, prefix=f".{cache_file.stem}.", suffix=".tmp", delete=False
        ) as file:
            temporary = Path(file.name)
            json.dump({"settings": settings, "passed": passed}, file)
        os.replace(temporary, cache_file)
    except OSError as err:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        log.warning(
            f"could not write the file-check cache {cache_file} ({err}); the next run checks every file "
            "again. Set data.check_cache to a writable folder, or null"
        )
