"""Test-only pieces that the real command line loads through Hydra (`+callbacks.stop._target_=tests.helpers...`)."""

import os

import lightning as L


class InterruptAtStep(L.Callback):
    """Raises KeyboardInterrupt (as Ctrl+C would) after the optimizer step $INTERRUPT_AT_STEP, if that is set.

    Read from the environment, so the interrupted and the resumed attempt have the same config.
    """

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        step = os.environ.get("INTERRUPT_AT_STEP")
        if step is not None and trainer.global_step == int(step):
            raise KeyboardInterrupt
