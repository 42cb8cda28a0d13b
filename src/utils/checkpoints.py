"""Checks on checkpoint paths given by the user, done before anything heavy starts."""

import zipfile
from pathlib import Path

from lightning.fabric.strategies.fsdp import _is_sharded_checkpoint


def check_checkpoint(path: str | None, key: str = "ckpt_path") -> Path:
    """Return `path` as a Path if it is a readable checkpoint file, else raise an error that says what is wrong."""
    if path is None:
        raise ValueError(f"{key} is required: {key}=logs/train/runs/<run>/checkpoints/best.ckpt")
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(
            f"{key}={path} does not exist; runs keep theirs in logs/train/runs/<run>/checkpoints/"
        )
    if _is_sharded_checkpoint(file):  # trainer=fsdp with state_dict_type=sharded saves directories
        return file
    if not file.is_file():
        raise IsADirectoryError(
            f"{key}={path} is a directory but not a sharded FSDP checkpoint; give a .ckpt file inside it"
        )
    try:
        with open(file, "rb"):
            pass
    except OSError as err:
        raise PermissionError(f"{key}={path} cannot be read: {err.strerror}") from None
    if not zipfile.is_zipfile(file):
        raise ValueError(
            f"{key}={path} is not a checkpoint (torch.save writes a zip archive; this file is not one)"
        )
    return file
