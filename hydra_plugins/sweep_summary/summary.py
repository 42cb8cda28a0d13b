"""A sweep's summary.csv and variants.csv, rebuilt from its jobs' result.json files: best job first (by the
run's `mode`). Jobs that differ only in a replicate key (`seed`, `data.fold`) are runs of one variant, with
the n, mean, std, min and max of every final metric (the report groups runs the same way). It works the same for grid sweeps,
searches and any launcher, local or on a cluster, because each job writes only its own file."""

import csv
import io
import json
import math
import statistics
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
SUMMARY_FILE = "summary.csv"
VARIANTS_FILE = "variants.csv"
RECORD_FILE = "run.json"  # written by the run itself (src/run/record.py): its final metrics
MODES = ("max", "min")
# Override keys whose jobs repeat one variant: their spread is the noise the variant's mean ± std reports.
REPLICATE_KEYS = ("seed", "data.fold")


def write_summary(sweep_dir: Path, mode: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rebuild `<sweep_dir>/summary.csv` from the result.json of every job: its rows, best first (mode max:
    the highest value first; min: the lowest). Where jobs repeat a variant (REPLICATE_KEYS), also rebuild
    `<sweep_dir>/variants.csv`: one row per variant, best mean first; its rows ([] without repeats) second."""
    if mode not in MODES:
        raise ValueError(f"mode={mode} is not valid; choose max or min")
    results = [json.loads(path.read_text()) for path in sweep_dir.glob(f"*/{RESULT_FILE}")]
    if not results:
        return [], []
    metric = next((r["metric"] for r in results if r["metric"]), None) or "value"
    settings = [dict(map(split_override, result["overrides"])) for result in results]
    swept = swept_keys(settings)
    sign = -1.0 if mode == "max" else 1.0

    def rank(row: dict[str, Any]) -> tuple:
        value, order = row[metric], {"completed": 0, "pruned": 1, "failed": 2}[row["status"]]
        return (order, not is_number(value), sign * value if is_number(value) else 0.0, row["job"])

    rows = sorted(
        (
            {"job": r["job"], "status": r["status"], metric: r["value"]}
            | {key: job.get(key, "") for key in swept}
            | {"error": r["error"] or ""}
            for r, job in zip(results, settings, strict=True)
        ),
        key=rank,
    )
    _write_csv(sweep_dir / SUMMARY_FILE, rows)
    # The optimized value under its name, also for a job whose run.json has no final metrics.
    runs = [
        {"settings": job, "status": r["status"], "metrics": (r.get("metrics") or {}) | {metric: r["value"]}}
        for r, job in zip(results, settings, strict=True)
    ]
    variants = group_variants(runs, metric, mode)
    if not any(variant["n"] + variant["not_completed"] > 1 for variant in variants):
        return rows, []
    _write_csv(sweep_dir / VARIANTS_FILE, variants)
    return rows, variants


def final_metrics(run_dir: Path) -> dict[str, float]:
    """The final metrics a run recorded in its run.json ({} when it wrote none, e.g. it failed to start)."""
    try:
        metrics = json.loads((run_dir / RECORD_FILE).read_text())["final_metrics"] or {}
    except (OSError, ValueError, KeyError):
        return {}
    return {name: value for name, value in metrics.items() if is_number(value)}


def format_table(rows: list[dict[str, Any]], metric_columns: int | None = None) -> str:
    """The rows as aligned text columns, for the log; with `metric_columns`, only that many of the columns
    that follow `not_completed` and the replicate keys (a variants table's first metric's mean and std)."""
    columns = list(rows[0])
    if metric_columns is not None and "not_completed" in columns:
        shown = columns.index("not_completed") + 1 + sum(key in columns for key in REPLICATE_KEYS)
        columns = columns[: shown + metric_columns]
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = [columns, *cells]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    # Imported here, not at the top: Hydra imports every plugin module on each start of any Hydra app, and
    # importing `src` registers this project's resolvers; only the project's own runs write a summary.
    from src.common.files import write_atomically

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_atomically(path, text.getvalue())


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
    # One variant: its settings are in the run configs, not a difference.
    varying = swept_keys([dict(key) for key in groups]) if len(groups) > 1 else []
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
            values = [run["metrics"][name] for run in done if is_number(run["metrics"].get(name))]
            spread = statistics.stdev(values) if len(values) > 1 else None
            stats = (statistics.fmean(values), spread, min(values), max(values)) if values else (None,) * 4
            row |= {f"{name} {stat}": v for stat, v in zip(("mean", "std", "min", "max"), stats, strict=True)}
        rows.append(row)

    def rank(row: dict[str, Any]) -> tuple:
        mean = row.get(f"{metric} mean")
        return (mean is None, sign * mean if mean is not None else 0.0)

    return sorted(rows, key=rank)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def swept_keys(jobs: list[dict[str, str]]) -> list[str]:
    """Override keys whose value differs between jobs (every key when there is only one job)."""
    keys = list(dict.fromkeys(key for job in jobs for key in job))
    return [key for key in keys if len(jobs) == 1 or len({job.get(key) for job in jobs}) > 1]


def split_override(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key, value
