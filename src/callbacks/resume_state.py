"""What a checkpoint needs beyond Lightning's own for a resumed run to go on as if it had never stopped.

- The global random generators: dropout, augmentation and random transforms draw from Python's, NumPy's and
  torch's. Lightning does not checkpoint them, so a resumed run would draw other numbers than an
  uninterrupted one. They are put back right before the first training batch after a resume, once the setup
  that also draws from them is over.
- The metrics logged so far (`trainer.callback_metrics`): a resumed Trainer starts with none until its next
  validation, so a `ModelCheckpoint` that saves every N steps would judge its next checkpoints without the
  score of the last validation (and save none, or other ones), and a run resumed from its final checkpoint
  would end without its validation metrics.
- Each ModelCheckpoint's step save that waits for the next validation (Lightning keeps it out of the
  callback's state): forgotten, the resumed run would save its best checkpoint at another step. The
  validation loaders are set up before the first batch, as a new run's sanity check does: ModelCheckpoint
  counts their batches to know whether a validation follows an epoch's last batch.

The states are stored as plain lists and tensors, loadable with weights_only=True.
"""

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from src.compat.lightning import deferred_save, set_deferred_save, set_up_validation_data


class ResumeState(L.Callback):
    """Saves the global RNG states, the logged metrics and the checkpoints' deferred saves with each
    checkpoint; restores them when training continues from one."""

    def __init__(self) -> None:
        self.trainer: L.Trainer | None = None
        self._to_restore: dict[str, Any] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.trainer = trainer  # its logged metrics go into each checkpoint's state

    def state_dict(self) -> dict[str, Any]:
        kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
        metrics = self.trainer.callback_metrics if self.trainer is not None else {}
        return {
            "python": random.getstate(),
            "numpy": [kind, torch.from_numpy(keys.copy()), position, has_gauss, cached_gauss],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "metrics": {name: torch.as_tensor(value).detach().cpu() for name, value in metrics.items()},
            "deferred_saves": [deferred_save(c) for c in _model_checkpoints(self.trainer)],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._to_restore = state_dict

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The last hook before a resumed run fetches its first batch, after the sanity check, which draws
        # random numbers and clears the logged metrics.
        if self._to_restore is not None:
            set_up_validation_data(trainer)  # before the random states are put back: it may draw from them
        self._restore(trainer)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Resumed from a checkpoint of finished training, the fit trains nothing and calls no training hook.
        self._restore(trainer)

    def _restore(self, trainer: L.Trainer) -> None:
        if self._to_restore is None:
            return
        state, self._to_restore = self._to_restore, None
        # Checkpoints of older versions have neither metrics nor deferred saves.
        trainer.callback_metrics.update(state.get("metrics", {}))
        deferred_saves = state.get("deferred_saves", [])
        for checkpoint, deferred in zip(_model_checkpoints(trainer), deferred_saves, strict=False):
            set_deferred_save(checkpoint, deferred)
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        kind, keys, position, has_gauss, cached_gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy(), position, has_gauss, cached_gauss))
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def _model_checkpoints(trainer: L.Trainer | None) -> list[ModelCheckpoint]:
    return [c for c in (trainer.callbacks if trainer else []) if isinstance(c, ModelCheckpoint)]
