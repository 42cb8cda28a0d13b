"""A Hydra callback that tabulates a multirun: which overrides gave which optimized_metric, and what failed.

Every job of a sweep writes `<job dir>/result.json` (its overrides, status, the value of `optimized_metric`,
its final metrics from run.json and the error of a failed job); the sweep dir's `summary.csv` is rebuilt
from those files after every job and once more at the end, best job first (by the run's `mode`: max or min).
Jobs that differ only in a replicate key (`seed`, `data.fold`) are runs of one variant: `variants.csv` has
one row per variant with n, mean, std, min and max of every final metric, best mean first. It works the same
for grid sweeps, Optuna studies (whose continued launches add to the same sweep dir) and any launcher, local
or on a cluster, because each job writes only its own file. Kept free of heavy imports: Hydra instantiates
it on every start.
"""

import contextlib
import csv
import io
import json
import logging
import math
import os
import statistics
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
VARIANTS_FILE = "variants.csv"
RECORD_FILE = "run.json"  # written by the run itself (src/run/record.py): its final metrics
MODES = ("max", "min")
# Override keys whose jobs repeat one variant: their spread is the noise the variant's mean ± std reports.
REPLICATE_KEYS = ("seed", "data.fold")


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
            error = job_error(job_return)
            # Into the job's own log file: Hydra keeps a failed job's traceback nowhere else.
            log.error("".join(traceback.format_exception(error)).rstrip())
        elif result["status"] == "pruned":
            log.info(result["error"])
        _write_atomically(job_dir / RESULT_FILE, json.dumps(result, indent=2) + "\n")
        write_summary(job_dir.parent, self._mode(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows, variants = summarize(sweep_dir, self._mode(config))
        if rows:
            log.info(f"Sweep summary ({sweep_dir / SUMMARY_FILE}):\n{format_table(rows)}")
        if variants:
            log.info(f"Variants ({sweep_dir / VARIANTS_FILE} has every metric):\n{format_table(variants, 2)}")

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
        "metrics": _final_metrics(Path(config.hydra.runtime.output_dir)),
    }
    if job_return.status == JobStatus.COMPLETED:
        value = job_return.return_value
        result["value"] = float(value) if isinstance(value, int | float) else None
    else:
        error = job_error(job_return)
        # optuna.TrialPruned, named rather than imported: optuna is needed only by Optuna sweeps.
        result["status"] = "pruned" if type(error).__name__ == "TrialPruned" else "failed"
        result["error"] = describe_error(error)
    return result


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


def write_summary(sweep_dir: Path, mode: str) -> list[dict[str, Any]]:
    """Rebuild `<sweep_dir>/summary.csv` (and variants.csv) from the jobs' result.json; return its rows."""
    return summarize(sweep_dir, mode)[0]


def summarize(sweep_dir: Path, mode: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rebuild `<sweep_dir>/summary.csv` from the result.json of every job: its rows, best first (mode max:
    the highest value first; min: the lowest). Where jobs repeat a variant (REPLICATE_KEYS), also rebuild
    `<sweep_dir>/variants.csv`: one row per variant, best mean first; its rows ([] without repeats) second."""
    if mode not in MODES:
        raise ValueError(f"mode={mode} is not valid; choose max or min")
    results = [json.loads(path.read_text()) for path in sweep_dir.glob(f"*/{RESULT_FILE}")]
    if not results:
        return [], []
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
    _write_csv(sweep_dir / SUMMARY_FILE, rows)
    runs = [
        {
            "settings": dict(_split(o) for o in result["overrides"]),
            "status": result["status"],
            # The optimized value under its name, also for a job whose run.json has no final metrics.
            "metrics": (result.get("metrics") or {}) | {metric: result["value"]},
        }
        for result in results
    ]
    variants = group_variants(runs, metric, mode)
    if not any(variant["n"] + variant["not_completed"] > 1 for variant in variants):
        return rows, []
    _write_csv(sweep_dir / VARIANTS_FILE, variants)
    return rows, variants


def group_variants(runs: list[dict[str, Any]], metric: str, mode: str) -> list[dict[str, Any]]:
    """One row per variant of `runs`, best mean of `metric` first (by `mode`).

    Each run is a dict of `settings` (key -> value text, e.g. its overrides), `status` and `metrics` (name ->
    value). Runs whose settings agree except for REPLICATE_KEYS are one variant. A row has the settings that
    tell the variants apart, `n` (completed runs), `not_completed` (failed or pruned ones: counted, never
    averaged), the replicate values it pooled, and for every metric its mean, std (sample standard deviation,
    n - 1; empty for n = 1), min and max over the completed runs.
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        identity = {k: v for k, v in run["settings"].items() if k not in REPLICATE_KEYS}
        groups.setdefault(tuple(sorted(identity.items())), []).append(run)
    varying = _swept_keys([[f"{k}={v}" for k, v in key] for key in groups])
    if len(groups) == 1:
        varying = []  # one variant: its settings are in the run configs, not a difference
    names = sorted({name for run in runs if run["status"] == "completed" for name in run["metrics"]})
    names.sort(key=lambda name: name != metric)  # the ranked metric first
    sign = -1.0 if mode == "max" else 1.0
    rows = []
    for key, members in groups.items():
        settings = dict(key)
        done = [run for run in members if run["status"] == "completed"]
        row: dict[str, Any] = {name: settings.get(name, "") for name in varying}
        row |= {"n": len(done), "not_completed": len(members) - len(done)}
        for replicate in REPLICATE_KEYS:
            values = sorted({run["settings"][replicate] for run in members if replicate in run["settings"]})
            if values:
                row[replicate] = " ".join(values)
        for name in names:
            values = [run["metrics"][name] for run in done if _is_number(run["metrics"].get(name))]
            row |= _statistics(name, values)
        rows.append(row)

    def rank(row: dict[str, Any]) -> tuple:
        mean = row.get(f"{metric} mean")
        return (mean is None, sign * mean if mean is not None else 0.0)

    return sorted(rows, key=rank)


def _statistics(name: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"{name} {stat}": None for stat in ("mean", "std", "min", "max")}
    return {
        f"{name} mean": statistics.fmean(values),
        f"{name} std": statistics.stdev(values) if len(values) > 1 else None,
        f"{name} min": min(values),
        f"{name} max": max(values),
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _final_metrics(run_dir: Path) -> dict[str, float]:
    """The final metrics a run recorded in its run.json ({} when it wrote none, e.g. it failed to start)."""
    try:
        record = json.loads((run_dir / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return {}
    metrics = record.get("final_metrics") if isinstance(record, dict) else None
    return {name: value for name, value in (metrics or {}).items() if _is_number(value)}


def format_table(rows: list[dict[str, Any]], metric_columns: int | None = None) -> str:
    """The rows as aligned text columns, for the log; with `metric_columns`, only that many of the columns
    that follow `not_completed` and the replicate keys (a variants table's first metric's mean and std)."""
    columns = list(rows[0])
    if metric_columns is not None and "not_completed" in columns:
        shown = columns.index("not_completed") + 1 + sum(key in columns for key in REPLICATE_KEYS)
        columns = columns[: shown + metric_columns]
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


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    _write_atomically(path, text.getvalue())


def _write_atomically(path: Path, text: str) -> None:
    """Readers never see a half-written file; jobs running in parallel each write their own temporary."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
