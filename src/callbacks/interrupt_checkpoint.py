"""A checkpoint of the moment training was interrupted, so that the run can continue from there."""

import logging
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn

log = logging.getLogger(__name__)


class InterruptCheckpoint(Checkpoint):
    """Saves `<dirpath>/<filename>.ckpt` when training raises (Ctrl+C, SIGTERM, an error), except:

    - for a non-finite loss (`FloatingPointError` from the training guards): the weights may be broken;
    - before the first training step (bad data found at set-up): there is nothing to continue from, and the
      untrained weights would replace an earlier attempt's file;
    - during validation: a run resumed from there would not validate again (Lightning issue #19549).

    A stage that then ends normally deletes the file: it would be older than the checkpoints after it.

    Not Lightning's OnExceptionCheckpoint, whose presence makes every `fit(ckpt_path=None)` mean "resume from
    the newest last*.ckpt of the checkpoint folders", with two warnings on each new run. Which checkpoint a run
    resumes from is the template's decision (src/run/resume.py), made once and recorded in run.json.
    """

    def __init__(self, dirpath: str, filename: str = "interrupted") -> None:
        if not filename:
            raise ValueError("callbacks.interrupt_checkpoint.filename is empty; give the file a name")
        self.path = Path(dirpath) / f"{filename}.ckpt"

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if isinstance(exception, FloatingPointError) or trainer.global_step == 0:
            return
        if trainer.validating and trainer.state.fn == TrainerFn.FITTING:
            # Resumed from here, a run skipped the rest of an epoch-end validation (or failed in early
            # stopping for want of its metric); the next attempt starts from the newest other checkpoint.
            log.info("Stopped during validation: no interrupted.ckpt (the run continues from its last save)")
            return
        trainer.save_checkpoint(self.path, weights_only=False)  # the full state, to resume from

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        trainer.strategy.remove_checkpoint(self.path)
