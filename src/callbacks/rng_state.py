"""Random-number-generator states in every checkpoint, restored when training resumes.

Dropout, augmentation and random transforms draw from Python's, NumPy's and torch's global generators.
Lightning does not checkpoint them, so a resumed run would draw other numbers than an uninterrupted one.
The states are stored as plain lists and tensors (loadable with weights_only=True) and put back right
before the first training batch after a resume, once the sanity check and the setup that also draw from
them are over.
"""

import random
from typing import Any

import lightning as L
import numpy as np
import torch


class RNGState(L.Callback):
    """Saves the global RNG states with each checkpoint; restores them when training continues from one."""

    def __init__(self) -> None:
        self._to_restore: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
        return {
            "python": random.getstate(),
            "numpy": [kind, torch.from_numpy(keys.copy()), position, has_gauss, cached_gauss],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._to_restore = state_dict

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The last hook before a resumed run fetches its first batch.
        if self._to_restore is None:
            return
        state, self._to_restore = self._to_restore, None
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        kind, keys, position, has_gauss, cached_gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy(), position, has_gauss, cached_gauss))
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
