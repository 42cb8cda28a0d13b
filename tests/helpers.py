"""Test-only pieces that the real command line loads through Hydra (`+callbacks.stop._target_=tests.helpers...`)."""

import os
import signal

import lightning as L


class InterruptAtStep(L.Callback):
    """Raises KeyboardInterrupt (as Ctrl+C would) after the optimizer step $INTERRUPT_AT_STEP, if that is set.

    Read from the environment, so the interrupted and the resumed attempt have the same config.
    """

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        step = os.environ.get("INTERRUPT_AT_STEP")
        if step is not None and trainer.global_step == int(step):
            raise KeyboardInterrupt


class KillAtStep(L.Callback):
    """Kills its own process with SIGKILL (no handler runs, nothing is saved on the way out) after the
    optimizer step $KILL_AT_STEP, if that is set: a machine lost mid-epoch, at a step the test chooses."""

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        step = os.environ.get("KILL_AT_STEP")
        if step is not None and trainer.global_step == int(step):
            os.kill(os.getpid(), signal.SIGKILL)
