"""A learning-rate schedule for fine-tuning: a linear warm-up, then a cosine decay, stepped per optimizer step."""

import logging
import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

log = logging.getLogger(__name__)


class WarmupCosine(LRScheduler):
    """From `start_factor` x each group's rate up to the rate itself over `warmup_steps` optimizer steps, then
    a half cosine down to `min_factor` x the rate at `total_steps`, where it stays.

    Each parameter group follows its own rate, so a backbone at a scaled rate keeps its ratio to the head.
    `interval` tells TaskModule to step it after every optimizer step (not every epoch).
    """

    interval = "step"

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int | None,
        warmup_steps: int = 0,
        start_factor: float = 0.0,
        min_factor: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        if total_steps is None:  # TaskModule.configure_optimizers fills in the run's length
            raise ValueError(
                "model.scheduler.total_steps=null needs the run's length: build it in a TaskModule"
            )
        if warmup_steps < 0:
            raise ValueError(f"model.scheduler.warmup_steps={warmup_steps} must be 0 (no warm-up) or more")
        if warmup_steps > total_steps:
            # A short run (a debug preset, a small dataset): the warm-up takes all of it.
            log.warning(
                f"model.scheduler.warmup_steps={warmup_steps} is longer than the run's {total_steps} optimizer "
                "steps: the learning rate rises over the whole run"
            )
            warmup_steps = total_steps
        self.total_steps, self.warmup_steps = int(total_steps), int(warmup_steps)
        self.start_factor, self.min_factor = start_factor, min_factor
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        """The share of the base rate at optimizer step `step` (0: before the first step)."""
        if step < self.warmup_steps:  # (warmup_steps > 0 here)
            return self.start_factor + (1 - self.start_factor) * step / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * progress))

    def get_lr(self) -> list[float]:
        return [base * self.factor(self.last_epoch) for base in self.base_lrs]
