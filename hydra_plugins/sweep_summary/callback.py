"""A Hydra callback that tabulates a multirun: after every job it writes the job's result.json (its
overrides, status, optimized_metric, final metrics, the error of a failed job) and rebuilds the sweep's
summary (summary.py). Kept free of heavy imports: Hydra instantiates it on every start."""

import contextlib
import io
import json
import logging
import traceback
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from hydra_plugins.sweep_summary.summary import (
    RESULT_FILE,
    SUMMARY_FILE,
    VARIANTS_FILE,
    final_metrics,
    format_table,
    write_summary,
)

log = logging.getLogger(__name__)


class SweepSummary(Callback):
    """Writes each job's result.json and the sweep's summary.csv (configured in configs/hydra/default.yaml)."""

    def __init__(self, mode: str = "max") -> None:
        # Not checked here: Hydra builds this callback for every run, before the task's preflight refuses a
        # bad top-level `mode` in one clear line (src/run/preflight.py); write_summary checks what it ranks by.
        self.mode = mode

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        job_dir, status, value, error = Path(config.hydra.runtime.output_dir), "completed", None, None
        if job_return.status == JobStatus.COMPLETED:
            value = job_return.return_value
        else:
            exception = job_error(job_return)
            # optuna.TrialPruned, named rather than imported: optuna is needed only by Optuna sweeps.
            status = "pruned" if type(exception).__name__ == "TrialPruned" else "failed"
            error = describe_error(exception)
            if status == "pruned":
                log.info(error)
            else:  # into the job's own log file: Hydra keeps a failed job's traceback nowhere else
                log.error("".join(traceback.format_exception(exception)).rstrip())
        result = {
            "job": config.hydra.job.num,
            "status": status,
            "metric": config.get("optimized_metric"),
            "value": float(value) if isinstance(value, int | float) else None,
            "overrides": list(job_return.overrides or []),
            "error": error,
            "metrics": final_metrics(job_dir),
        }
        from src.common.files import write_atomically  # here, not at the top: see summary.py's _write_csv

        write_atomically(job_dir / RESULT_FILE, json.dumps(result, indent=2) + "\n")
        write_summary(job_dir.parent, self._mode(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows, variants = write_summary(sweep_dir, self._mode(config))
        if rows:
            log.info(f"Sweep summary ({sweep_dir / SUMMARY_FILE}):\n{format_table(rows)}")
        if variants:
            log.info(f"Variants ({sweep_dir / VARIANTS_FILE} has every metric):\n{format_table(variants, 2)}")

    def _mode(self, config: DictConfig) -> str:
        """The sweeper's mode when it has one (an Optuna study, so the summary ranks as the study does), else
        this callback's; both follow the run's `mode` unless set apart."""
        return config.hydra.sweeper.get("mode", self.mode)


def job_error(job_return: JobReturn) -> BaseException:
    """The exception a failed job raised: Hydra's `return_value` raises it again, after writing "Error
    executing job with overrides: [...]" to stderr, which is left out here (the summary says which job)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            job_return.return_value  # noqa: B018 - raises the job's exception
    except Exception as error:
        return error
    raise ValueError(f"the job did not fail (status {job_return.status.name})")


def describe_error(error: BaseException) -> str:
    """`Type: message` of the root cause, on one line (Hydra wraps errors raised while instantiating)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {' '.join(str(error).split())}"
