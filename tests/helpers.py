"""Test-only pieces that the real command line loads through Hydra (`+callbacks.stop._target_=tests.helpers...`)."""

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import lightning as L
import torch  # [part: pretrained]

from src.run.checkpoints import AtomicCheckpointIO


class InterruptAtStep(L.Callback):
    """Raises KeyboardInterrupt (as Ctrl+C would) once, after optimizer step `InterruptAtStep.step` (set it to
    arm it)."""

    step: int | None = None

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if trainer.global_step == InterruptAtStep.step:
            InterruptAtStep.step = None
            raise KeyboardInterrupt


# part: pretrained
class RecordWeights(L.Callback):
    """Keeps the module's state after every optimizer step and saves the list to `path` when training ends:
    the raw weights a test recomputes a weight average from."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args, **kwargs) -> None:
        self.steps.append({name: value.detach().clone() for name, value in pl_module.state_dict().items()})

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.save(self.steps, self.path)


# /part


class RecordValidationSet(L.Callback):
    """Writes `<folder>/val_rank<global rank>.json` when training starts: the size of the datamodule's validation
    set and a digest of its tensors, as that rank set it up."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dataset = trainer.datamodule.data_val
        digest = hashlib.sha256(b"".join(t.cpu().numpy().tobytes() for t in dataset.tensors)).hexdigest()
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {"size": len(dataset), "digest": digest}
        (self.folder / f"val_rank{trainer.global_rank}.json").write_text(json.dumps(record))


class SnapshotCheckpointIO(AtomicCheckpointIO):
    """The template's checkpoint writer, which also copies the run dir (without its logs) into
    `<folder>/<n>` after each checkpoint it writes. A kill leaves the files as the last finished write left
    them (each write is atomic), so these copies are every state a kill can leave a run in."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = Path(folder)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        if Path(path).parent.name != "checkpoints":  # ddp_fork's weights for its main process, in /tmp/tmp*/
            return
        taken = len(list(self.folder.glob("*"))) if self.folder.exists() else 0
        logs = shutil.ignore_patterns("csv", "*.log")
        shutil.copytree(Path(path).parent.parent, self.folder / f"{taken:03d}", ignore=logs)


class StopAt(L.Callback):
    """Sends this process SIGTERM, as a cluster's preemption would, once: after optimizer step `step`, or, with
    `validation_batch`, in that batch of the validation after it. Set `StopAt.moment = (step,
    validation_batch or None)` to arm it (in-process tests)."""

    moment: tuple[int, int | None] | None = None

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        self._stop_if_at(trainer, None)

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int, *args) -> None:
        if not trainer.sanity_checking:
            self._stop_if_at(trainer, batch_idx)

    def _stop_if_at(self, trainer: L.Trainer, validation_batch: int | None) -> None:
        if StopAt.moment == (trainer.global_step, validation_batch):
            StopAt.moment = None
            os.kill(os.getpid(), signal.SIGTERM)
