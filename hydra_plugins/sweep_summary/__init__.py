"""A Hydra callback that tabulates a multirun: which overrides gave which optimized_metric, and what failed.

Every job of a sweep writes `<job dir>/result.json` (its overrides, status, the value of `optimized_metric`
and the error of a failed job); the sweep dir's `summary.csv` is rebuilt from those files after every job
and once more at the end, best job first (by the run's `mode`: max or min). It works the same for grid
sweeps, Optuna studies (whose continued launches add to the same sweep dir) and any launcher, local or on a
cluster, because each job writes only its own file. Kept free of heavy imports: Hydra instantiates it on
every start.
"""

import csv
import io
import json
import logging
import math
import os
import traceback
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

log = logging.getLogger(__name__)

RESULT_FILE = "result.json"
SUMMARY_FILE = "summary.csv"
MODES = ("max", "min")


class SweepSummary(Callback):
    """Writes each job's result.json and the sweep's summary.csv (configured in configs/hydra/default.yaml)."""

    def __init__(self, mode: str = "max") -> None:
        # Not checked here: Hydra builds this callback for every run, before the task's preflight refuses a
        # bad top-level `mode` in one clear line (src/run/preflight.py); write_summary checks what it ranks by.
        self.mode = mode

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        job_dir = Path(config.hydra.runtime.output_dir)
        result = job_result(config, job_return)
        if result["status"] == "failed":
            error = job_return._return_value  # the exception (`return_value` would re-raise it)
            # Into the job's own log file: Hydra keeps a failed job's traceback nowhere else.
            log.error("".join(traceback.format_exception(error)).rstrip())
        elif result["status"] == "pruned":
            log.info(result["error"])
        _write_atomically(job_dir / RESULT_FILE, json.dumps(result, indent=2) + "\n")
        write_summary(job_dir.parent, self._mode(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = write_summary(sweep_dir, self._mode(config))
        if rows:
            log.info(f"Sweep summary ({sweep_dir / SUMMARY_FILE}):\n{format_table(rows)}")

    def _mode(self, config: DictConfig) -> str:
        """The sweeper's mode when it has one (an Optuna study, so the summary ranks as the study does), else
        this callback's; both follow the run's `mode` unless set apart."""
        return config.hydra.sweeper.get("mode", self.mode)


def job_result(config: DictConfig, job_return: JobReturn) -> dict[str, Any]:
    """What one job of a sweep ran and how it ended."""
    result = {
        "job": config.hydra.job.num,
        "status": "completed",
        "metric": config.get("optimized_metric"),
        "value": None,
        "overrides": list(job_return.overrides or []),
        "error": None,
    }
    if job_return.status == JobStatus.COMPLETED:
        value = job_return.return_value
        result["value"] = float(value) if isinstance(value, int | float) else None
    else:
        error = job_return._return_value
        # optuna.TrialPruned, named rather than imported: optuna is needed only by Optuna sweeps.
        result["status"] = "pruned" if type(error).__name__ == "TrialPruned" else "failed"
        result["error"] = describe_error(error)
    return result


def describe_error(error: BaseException) -> str:
    """`Type: message` of the root cause, on one line (Hydra wraps errors raised while instantiating)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def write_summary(sweep_dir: Path, mode: str) -> list[dict[str, Any]]:
    """Rebuild `<sweep_dir>/summary.csv` from the result.json of every job; return its rows, best first
    (mode max: the highest value first; min: the lowest)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode} is not valid; choose max or min")
    results = [json.loads(path.read_text()) for path in sweep_dir.glob(f"*/{RESULT_FILE}")]
    if not results:
        return []
    metric = next((r["metric"] for r in results if r["metric"]), None) or "value"
    swept = _swept_keys([r["overrides"] for r in results])
    sign = -1.0 if mode == "max" else 1.0

    def rank(result: dict[str, Any]) -> tuple:
        value = result["value"]
        has_value = value is not None and math.isfinite(value)
        order = {"completed": 0, "pruned": 1, "failed": 2}[result["status"]]
        return (order, not has_value, sign * value if has_value else 0.0, result["job"])

    rows = []
    for result in sorted(results, key=rank):
        overrides = dict(_split(o) for o in result["overrides"])
        row = {"job": result["job"], "status": result["status"], metric: result["value"]}
        row |= {key: overrides.get(key, "") for key in swept}
        row["error"] = result["error"] or ""
        rows.append(row)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    _write_atomically(sweep_dir / SUMMARY_FILE, text.getvalue())
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as aligned text columns, for the log."""
    columns = list(rows[0])
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(line.rstrip() for line in lines)


def _swept_keys(override_lists: list[list[str]]) -> list[str]:
    """Override keys whose value differs between jobs (every key when there is only one job)."""
    jobs = [dict(map(_split, overrides)) for overrides in override_lists]
    keys = list(dict.fromkeys(key for job in jobs for key in job))
    if len(jobs) == 1:
        return keys
    return [key for key in keys if len({job.get(key) for job in jobs}) > 1]


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key, value


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _write_atomically(path: Path, text: str) -> None:
    """Readers never see a half-written file; jobs running in parallel each write their own temporary."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
