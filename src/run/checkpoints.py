"""Checkpoints: written atomically, and checked before anything heavy starts when the user names one."""

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import fsspec
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

PARTIAL_SUFFIX = ".tmp"  # of a checkpoint being written: `.<name>.<pid>.tmp` beside the target


def cut_short_writes(folder: Path) -> list[Path]:
    """The temporary files in `folder` of checkpoint writes that a kill cut short."""
    return sorted(folder.glob(f".*.ckpt.*{PARTIAL_SUFFIX}"))


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, made atomic on local disks: write a temporary file beside the target,
    flush it to disk, then rename it over the target.

    Lightning writes through an fsspec transaction whose temporary file lives in the system temp dir; when
    that is another file system than the run dir (a local /tmp, runs on network storage) the final move is a
    copy, and a kill during it leaves a truncated last.ckpt in place of the previous one. A rename within one
    directory is atomic: the target is always either the old checkpoint or the complete new one.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or fsspec.utils.get_protocol(str(path)) != "file":
            super().save_checkpoint(checkpoint, path, storage_options)  # remote storage: fsspec's transaction
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}{PARTIAL_SUFFIX}")
        try:
            with open(temporary, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise


def check_checkpoint(path: str) -> Path:
    """Return `path` as a Path if it is a readable checkpoint file, else raise an error that says what is wrong."""
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(
            f"ckpt_path={path} does not exist; runs keep theirs in logs/train/runs/<run>/checkpoints/"
        )
    if is_sharded_checkpoint(file):
        return file
    if file.is_dir():
        raise IsADirectoryError(
            f"ckpt_path={path} is a directory but not a sharded FSDP checkpoint; give a .ckpt file inside it"
        )
    if not zipfile.is_zipfile(file):  # also False for a file that cannot be read
        raise ValueError(
            f"ckpt_path={path} is not a checkpoint, or cannot be read (torch.save writes a zip archive; this file "
            "is not one)"
        )
    return file


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether `path` is a checkpoint of FSDP shards: `trainer=fsdp` with `state_dict_type=sharded` saves a
    directory of shards, with Lightning's `meta.pt` (the loops' and callbacks' state) beside them."""
    return path.is_dir() and (path / "meta.pt").is_file()


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint's contents, loaded the safe way (`weights_only=True`, memory-mapped, on the CPU).

    A file that holds pickled Python objects other than tensors and plain data is refused before anything
    in it runs: unpickling such a file can execute arbitrary code.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"ckpt_path={path} holds Python objects that are not plain data, so it was not loaded (a pickle can run "
            f"code while loading; torch.load(weights_only=True) refused it: {detail}). This template's checkpoints "
            "hold only tensors and plain data; load a file from elsewhere only if you trust where it came from"
        ) from None


def check_fits(model: torch.nn.Module, path: str | Path) -> None:
    """Refuse a checkpoint whose weights do not fit `model`, naming the tensors that differ, by loading them
    into it: the model is given these weights next anyway."""
    if is_sharded_checkpoint(Path(path)):
        return  # FSDP shards: the strategy checks them as it loads them
    state = load_checkpoint(path).get("state_dict")
    if state is None:
        raise ValueError(f"ckpt_path={path} has no state_dict: it is not a Lightning checkpoint of a model")
    # torch.compile(net) elsewhere saves under `_orig_mod.`; ClassifierModule.on_load_checkpoint drops it.
    try:
        model.load_state_dict({name.replace("_orig_mod.", ""): tensor for name, tensor in state.items()})
    except RuntimeError as err:
        # what follows "Error(s) in loading state_dict for X: "
        problems = " ".join(str(err).split()).partition(": ")[2]
        raise ValueError(
            f"ckpt_path={path} does not fit this model ({problems[:1500]}); was it trained with another model=, "
            "model/net=, data= or mode= (compose the same options as its training run, or give its run_dir=)?"
        ) from None
