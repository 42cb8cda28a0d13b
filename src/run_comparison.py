"""A report across runs, sweeps and Optuna studies, read from their run dirs alone: `python src/report.py`.

What it reads from each run dir: `run.json` (src/run/record.py: status, error, duration, git commit, final
metrics and the resolved config), the CSV log `csv/version_*/metrics.csv` (the learning curves and the best
value of each metric) and, for a job of a sweep or study, `result.json` (hydra_plugins/sweep_summary: a
pruned trial says so there). It imports neither torch nor Lightning, needs no network and never opens
optuna.db or a tracking server.

What it writes into its own run dir (logs/report/runs/<time>/):
- report.md and report.csv: one row per run: its name, source (sweep or study), status, the config keys
  whose values differ between the runs, the final value of each chosen metric and its best value over the
  CSV log, duration, git commit, error. Runs that did not complete are listed too, with their error.
- variants.csv (and a table in report.md), when runs repeat a variant (differ only in `seed` or
  `data.fold`): n, not completed, mean, std, min and max of each metric's final value, best mean first.
- curves_<metric>.png: the metric over the epoch, one line per run (from the CSV log), and
  variants_<metric>.png: one bar per variant, its mean with the std as error bar.
"""

import csv
import glob
import io
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from hydra_plugins.sweep_summary.summary import (
    MODES,
    REPLICATE_KEYS,
    RESULT_FILE,
    format_table,
    group_variants,
)
from src.run.extras import apply_extras
from src.run.record import RECORD_FILE, flatten

log = logging.getLogger(__name__)

# The CSV log of logger=csv (Lightning's CSVLogger): a resumed run continues in version_1, ...
CSV_LOGS = "csv/version_*/metrics.csv"
# The curves' x axis: the epoch, which compares runs of other batch or dataset sizes; the step for a metric
# logged without epochs (the learning rate, `lr-Adam`). Neither is a metric.
AXES = ("epoch", "step")


class Point(NamedTuple):
    """One value of a metric in the CSV log, where it was logged."""

    epoch: float | None
    step: float | None
    value: float


@dataclass
class Run:
    """One run dir, as read from its files."""

    path: Path
    name: str  # <sweep or study dir name>/<job number> for a job, else the run dir's name
    source: str  # the sweep or study dir's name; "" for a single run
    record: dict[str, Any]  # run.json
    result: dict[str, Any] | None  # result.json of a sweep's job
    has_log: bool = False
    log: dict[str, list[Point]] = field(default_factory=dict)  # metric -> its values in the CSV log

    @property
    def config(self) -> dict[str, Any]:
        return self.record.get("config") or {}

    @property
    def status(self) -> str:
        # A pruned Optuna trial ends with an error (run.json: failed); its result.json knows better.
        if self.result and self.result.get("status") == "pruned":
            return "pruned"
        return self.record.get("status") or "unknown"

    @property
    def error(self) -> str:
        return self.record.get("error") or (self.result or {}).get("error") or ""

    @property
    def final_metrics(self) -> dict[str, float]:
        metrics = self.record.get("final_metrics") or {}
        return {name: value for name, value in metrics.items() if isinstance(value, int | float)}

    @property
    def logged(self) -> set[str]:
        return set(self.final_metrics) | set(self.log)


def report(cfg: DictConfig) -> Path:
    """Tabulate and plot the runs of `cfg.runs` into this run's dir; return the path of report.md.

    What a report needs is checked before anything is written: the runs exist, the metrics were logged.
    """
    runs = find_runs(cfg.get("runs"), Path(cfg.paths.work_dir))
    metrics = chosen_metrics(cfg.get("metrics"), runs)
    modes = metric_modes(metrics, cfg.get("mode"), runs)
    apply_extras(cfg)
    for run in runs:
        if run.status != "completed":
            log.warning(f"{run.name} {run.status}: {run.error or 'no error recorded'} ({run.path})")
        if not run.has_log:
            log.warning(f"{run.name} has no CSV log ({run.path / CSV_LOGS}; logger=csv writes it): no curves")

    settings = differing_settings(runs, cfg.get("ignore_keys") or [])
    rows = table(runs, settings, metrics, modes)
    variants = grouped_variants(runs, settings, metrics, modes)
    written = write(Path(cfg.paths.output_dir), runs, settings, rows, variants, metrics, modes)

    table_text = short_table(rows, settings, metrics)
    log.info(f"Report of {_runs(len(runs))} (report.md has every differing key):\n{table_text}")
    if variants:
        log.info(f"Variants (best {metrics[0]} mean first):\n{format_table(short_variants(variants), 2)}")
    log.info("Wrote " + ", ".join(str(path) for path in written))
    return written[0]


def write(
    out: Path,
    runs: list[Run],
    settings: list[dict[str, str]],
    rows: list[dict[str, Any]],
    variants: list[dict[str, Any]],
    metrics: list[str],
    modes: dict[str, str],
) -> list[Path]:
    """Write report.md, report.csv, variants.csv (when there are variants) and the plots into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "report.csv", rows)
    written = [out / "report.md", out / "report.csv"]
    if variants:
        write_csv(out / "variants.csv", variants)
        written.append(out / "variants.csv")
    plots = []
    for metric in metrics:
        curves = out / f"curves_{file_name(metric)}.png"
        if plot_curves(curves, metric, runs, settings):
            plots.append(curves)
        else:
            log.warning(f"no run's CSV log has {metric}: no {curves.name}")
        bars = out / f"variants_{file_name(metric)}.png"
        if variants and plot_variants(bars, metric, modes[metric], variants):
            plots.append(bars)
    (out / "report.md").write_text(markdown(rows, variants, metrics, modes, [path.name for path in plots]))
    return written + plots


# --- what runs ----------------------------------------------------------------------------------------------


def find_runs(entries: Any, cwd: Path) -> list[Run]:
    """The runs of `runs=`: run dirs, sweep or study dirs (their run dirs one level down) or globs of them,
    relative to `cwd`; each run once, in the order given (a sweep's jobs by number)."""
    if isinstance(entries, str):
        entries = [entries]
    entries = [str(entry) for entry in (entries or [])]
    if not entries:
        raise ValueError(
            "runs= is empty; give run dirs, sweep or study dirs, or globs: "
            "runs=[logs/train/multiruns/*,logs/train/runs/<run>]"
        )
    found: dict[Path, Run] = {}
    for entry in entries:
        pattern = Path(entry).expanduser()
        where = "" if pattern.is_absolute() else f" (relative paths start from {cwd})"
        pattern = cwd / pattern  # an absolute pattern stays as it is
        if glob.has_magic(entry):
            matches = [Path(path) for path in sorted(glob.glob(str(pattern)))]
            if not matches:
                raise ValueError(f"runs={entry} matches nothing{where}")
            runs = [run for path in matches for run in runs_in(path)]
            what = f"none of its {len(matches)} matches is a run dir or holds one"
        elif not pattern.exists():
            raise FileNotFoundError(f"runs={entry}: {pattern} does not exist{where}")
        else:
            runs = runs_in(pattern)
            what = f"{pattern} is no run dir and holds none"
        if not runs:
            raise ValueError(
                f"runs={entry}: {what}; a run dir holds {RECORD_FILE} (every train, eval, predict and export "
                "run writes one), a sweep or study dir holds run dirs (0/, 1/, ...)"
            )
        for run in runs:
            found.setdefault(run.path.resolve(), run)
    return list(found.values())


def runs_in(path: Path) -> list[Run]:
    """`path` when it is a run dir, else the run dirs one level below it (a sweep's or study's jobs)."""
    if (path / RECORD_FILE).is_file():
        return [read_run(path, in_sweep=(path / RESULT_FILE).is_file())]
    if not path.is_dir():
        return []
    jobs = [child for child in path.iterdir() if (child / RECORD_FILE).is_file()]
    jobs.sort(key=lambda job: (not job.name.isdigit(), int(job.name) if job.name.isdigit() else 0, job.name))
    return [read_run(job, in_sweep=True) for job in jobs]


def read_run(path: Path, in_sweep: bool) -> Run:
    try:
        record = json.loads((path / RECORD_FILE).read_text())
    except ValueError as err:
        raise ValueError(f"{path / RECORD_FILE} is not valid JSON ({err}); is it a run record?") from err
    result_file = path / RESULT_FILE
    result = json.loads(result_file.read_text()) if result_file.is_file() else None
    source = path.parent.name if in_sweep else ""
    run = Run(
        path=path,
        name=f"{source}/{path.name}" if source else path.name,
        source=source,
        record=record,
        result=result,
    )
    run.has_log, run.log = read_log(path)
    return run


def read_log(run_dir: Path) -> tuple[bool, dict[str, list[Point]]]:
    """Every metric of the run's CSV log, in the order logged; its versions in order (a resumed run
    continues in the next). False when the run has no CSV log."""
    files = sorted(run_dir.glob(CSV_LOGS), key=lambda path: _version(path.parent.name))
    series: dict[str, list[Point]] = {}
    for path in files:
        with open(path, newline="") as file:
            for row in csv.DictReader(file):
                epoch, step = _number(row.get("epoch")), _number(row.get("step"))
                for name, text in row.items():
                    value = _number(text)
                    if name not in AXES and value is not None:
                        series.setdefault(name, []).append(Point(epoch, step, value))
    return bool(files), series


def chosen_metrics(metrics: Any, runs: list[Run]) -> list[str]:
    """`metrics=` (one name or a list), or null: each run's `optimized_metric` (else its `monitor`). A name
    that no run logged (in run.json's final metrics or the CSV log) is an error."""
    if isinstance(metrics, str):
        names = [metrics]
    elif metrics is not None:
        names = [str(name) for name in metrics]
    else:
        names = [run.config.get("optimized_metric") or run.config.get("monitor") for run in runs]
        names = list(dict.fromkeys(name for name in names if name))
    logged = ", ".join(sorted(set().union(*(run.logged for run in runs)))) or "none"
    if not names:
        why = "names no metric" if metrics is not None else "is null and the runs name no optimized_metric"
        raise ValueError(f"metrics={metrics} {why}; give metrics=[...] from the logged metrics: {logged}")
    for name in names:
        if not any(name in run.logged for run in runs):
            raise ValueError(f"metrics={name}: no run logged it; logged metrics: {logged}")
    return names


def metric_modes(metrics: list[str], mode: Any, runs: list[Run]) -> dict[str, str]:
    """Which way each metric is better: `mode=max|min` for all, `mode={name:min}` per metric, and for the
    rest the runs' `mode` for the metric they watch (`monitor`, its `_best`, `optimized_metric`), min for a
    loss (a name ending in `loss`), max for any other."""
    given = OmegaConf.to_container(mode) if isinstance(mode, DictConfig) else mode
    if isinstance(given, Mapping):
        unknown = [name for name in given if name not in metrics]
        if unknown:
            raise ValueError(
                f"mode names {', '.join(unknown)}, not among metrics=[{','.join(metrics)}]; "
                "give a mode for those metrics, or add them to metrics="
            )
    elif given is not None:
        given = dict.fromkeys(metrics, given)
    else:
        given = {}
    for name, value in given.items():
        if value not in MODES:
            raise ValueError(f"mode={value} (for {name}) is not valid; choose max or min")
    modes = {}
    for metric in metrics:
        if metric in given:
            modes[metric] = given[metric]
            continue
        watching = {}
        for run in runs:
            watched = run.config.get("monitor")
            if metric in (watched, f"{watched}_best", run.config.get("optimized_metric")):
                watching.setdefault(run.config.get("mode"), run.name)
        watching.pop(None, None)
        if len(watching) > 1:
            which = ", ".join(f"{value} ({name})" for value, name in watching.items())
            raise ValueError(
                f"the runs watch {metric} with different modes: {which}; give mode=max or mode=min"
            )
        modes[metric] = next(iter(watching), None) or ("min" if metric.endswith("loss") else "max")
    return modes


# --- the tables ---------------------------------------------------------------------------------------------


def differing_settings(runs: list[Run], ignore: Iterable[str]) -> list[dict[str, str]]:
    """Per run, the flattened config keys (`model.net.hidden_sizes`) whose values differ between the runs,
    as text (`[256,128]`). Left out: the keys in `ignore` and below them, and keys whose value lies inside
    the run's own dir (checkpoint dirs, logger dirs: always different, and about where files go)."""
    ignore = tuple(ignore)
    flat = []
    for run in runs:
        own_dir = str(run.record.get("run_dir") or run.config.get("paths", {}).get("output_dir") or run.path)
        flat.append(
            {
                key: _text(value)
                for key, value in flatten(run.config).items()
                if not any(key == k or key.startswith(f"{k}.") for k in ignore)
                and not (isinstance(value, str) and (value == own_dir or value.startswith(f"{own_dir}/")))
            }
        )
    keys = list(dict.fromkeys(key for settings in flat for key in settings))
    differing = [key for key in keys if len({settings.get(key) for settings in flat}) > 1]
    return [{key: settings[key] for key in differing if key in settings} for settings in flat]


def table(
    runs: list[Run], settings: list[dict[str, str]], metrics: list[str], modes: dict[str, str]
) -> list[dict[str, Any]]:
    """The rows of report.csv, in the order of the runs."""
    keys = list(dict.fromkeys(key for run_settings in settings for key in run_settings))
    rows = []
    for run, run_settings in zip(runs, settings, strict=True):
        row: dict[str, Any] = {"run": run.name, "source": run.source, "status": run.status}
        row |= {key: run_settings.get(key, "") for key in keys}
        for metric in metrics:
            values = [point.value for point in run.log.get(metric, []) if math.isfinite(point.value)]
            row[metric] = run.final_metrics.get(metric)
            row[f"{metric} best"] = (max if modes[metric] == "max" else min)(values) if values else None
        git = run.record.get("git") or {}
        commit = (git.get("commit") or "")[:7]
        row["duration_s"] = run.record.get("duration_s")
        row["git"] = f"{commit}-dirty" if commit and git.get("dirty") else commit
        row["error"] = run.error
        row["path"] = str(run.path.resolve())
        rows.append(row)
    return rows


def grouped_variants(
    runs: list[Run], settings: list[dict[str, str]], metrics: list[str], modes: dict[str, str]
) -> list[dict[str, Any]]:
    """The variants table (hydra_plugins/sweep_summary's group_variants over the final values of the chosen
    metrics), or [] when no variant was run more than once."""
    grouped = group_variants(
        [
            {
                "settings": run_settings,
                "status": run.status,
                "metrics": {m: run.final_metrics[m] for m in metrics if m in run.final_metrics},
            }
            for run, run_settings in zip(runs, settings, strict=True)
        ],
        metrics[0],
        modes[metrics[0]],
    )
    return grouped if any(row["n"] + row["not_completed"] > 1 for row in grouped) else []


def markdown(
    rows: list[dict[str, Any]],
    variants: list[dict[str, Any]],
    metrics: list[str],
    modes: dict[str, str],
    plots: list[str],
) -> str:
    """report.md: what the columns mean, the runs table, the variants table, the plots."""
    sources = list(dict.fromkeys(row["source"] or "single runs" for row in rows))
    lines = [
        "# Report",
        "",
        f"{_runs(len(rows))} from {', '.join(sources)}. For each metric: its final value (run.json) and its "
        "best over the CSV log ("
        + ", ".join(f"{metric}: {modes[metric]}" for metric in metrics)
        + "). Columns between status and the metrics: the config keys whose values differ between the runs.",
        "",
        "## Runs",
        "",
        *_markdown_table([{k: v for k, v in row.items() if k != "path"} for row in rows]),
    ]
    if variants:
        replicates = " or ".join(f"`{key}`" for key in REPLICATE_KEYS)
        lines += [
            "",
            "## Variants",
            "",
            f"Runs that differ only in {replicates} are one variant: n completed runs (not_completed "
            "ones are counted, never averaged), mean, std (n - 1), min and max of each final value; best "
            f"{metrics[0]} mean ({modes[metrics[0]]}) first.",
            "",
            *_markdown_table(variants),
        ]
    if plots:
        lines += ["", "## Plots", "", *(f"![{name}]({name})" for name in plots)]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(text.getvalue())


# --- the plots ----------------------------------------------------------------------------------------------


def plot_curves(path: Path, metric: str, runs: list[Run], settings: list[dict[str, str]]) -> bool:
    """`metric` over the epoch (or the step, see AXES), one line per run that logged it; False (and no file)
    if none did."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    axis = curve_axis(metric, runs)
    drawn = []
    for run, name in zip(runs, labels(runs, settings), strict=True):
        line = [(getattr(p, axis), p.value) for p in run.log.get(metric, []) if getattr(p, axis) is not None]
        if line:
            drawn.append((name, line))
    if not drawn:
        return False
    longest = max(len(name) for name, _ in drawn)
    figure = Figure(figsize=(max(8.0, 0.07 * longest + 1), 4.5 + 0.2 * len(drawn)), layout="constrained")
    axes = figure.add_subplot()
    for name, line in drawn:
        x, y = zip(*line, strict=True)
        few = len(x) <= 30  # a run of a few epochs: its points, not just a line
        axes.plot(x, y, marker="o" if few else None, markersize=3, label=name)
    axes.set(xlabel=f"{axis} (as the CSV log has it)", ylabel=metric, title=metric)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # no epoch 0.2
    axes.grid(alpha=0.3)
    figure.legend(loc="outside lower center", fontsize="small")
    figure.savefig(path, dpi=100)  # PNG through Agg: no display needed
    return True


def curve_axis(metric: str, runs: list[Run]) -> str:
    """`epoch` when a run logged `metric` with one, else `step` (see AXES)."""
    logged = [point for run in runs for point in run.log.get(metric, [])]
    return "epoch" if any(point.epoch is not None for point in logged) else "step"


def plot_variants(path: Path, metric: str, mode: str, variants: list[dict[str, Any]]) -> bool:
    """One bar per variant, best first from the top: the mean of `metric`'s final values, the std as error
    bar; False (and no file) when no run completed with a final value of it."""
    from matplotlib.figure import Figure

    means = [row.get(f"{metric} mean") for row in variants]
    if all(mean is None for mean in means):
        return False
    names = [
        f"{text or 'all runs'} (n={row['n']})"
        for text, row in zip(
            settings_texts([variant_settings(row) for row in variants]), variants, strict=True
        )
    ]
    longest = max(len(name) for name in names)
    figure = Figure(figsize=(4 + 0.07 * longest, 1.5 + 0.4 * len(variants)), layout="constrained")
    axes = figure.add_subplot()
    positions = list(range(len(variants)))
    widths = [math.nan if mean is None else mean for mean in means]
    axes.barh(positions, widths, xerr=[row.get(f"{metric} std") or 0.0 for row in variants], capsize=4)
    axes.set_yticks(positions, names, fontsize="small")
    axes.invert_yaxis()  # the best variant on top, as in the table
    axes.set(xlabel=f"{metric} (mean ± std)", title=f"{metric}, final values ({mode} is better)")
    axes.grid(axis="x", alpha=0.3)
    figure.savefig(path, dpi=100)
    return True


def variant_settings(variant: dict[str, Any]) -> dict[str, str]:
    """The settings that tell a variant apart: the columns of a variants row before `n`, where it has them."""
    keys = list(variant)[: list(variant).index("n")]
    return {key: str(variant[key]) for key in keys if variant[key] not in ("", None)}


def short_table(rows: list[dict[str, Any]], settings: list[dict[str, str]], metrics: list[str]) -> str:
    """Run, status, its `compact` settings and the metrics' final values, as text for the console."""
    short = [compact(run_settings) for run_settings in settings]
    columns = list(dict.fromkeys(key for run_settings in short for key in run_settings))
    return format_table(
        [
            {"run": row["run"], "status": row["status"]}
            | {key: run_settings.get(key, "") for key in columns}
            | {metric: row[metric] for metric in metrics}
            for row, run_settings in zip(rows, short, strict=True)
        ]
    )


def short_variants(variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The variants rows with their settings `compact`, for the console."""
    short = [compact(variant_settings(row)) for row in variants]
    columns = list(dict.fromkeys(key for settings in short for key in settings))
    rest = list(variants[0])[list(variants[0]).index("n") :]
    return [
        {key: settings.get(key, "") for key in columns} | {key: row[key] for key in rest}
        for row, settings in zip(variants, short, strict=True)
    ]


def labels(runs: list[Run], settings: list[dict[str, str]]) -> list[str]:
    """Legend labels: what sets each run apart (`net=MLP, seed=1`), with the run's name in front where two
    runs would read the same or nothing sets it apart."""
    texts = settings_texts(settings)
    return [
        f"{run.name}: {text}" if text and texts.count(text) > 1 else text or run.name
        for run, text in zip(runs, texts, strict=True)
    ]


def settings_texts(settings: list[dict[str, str]]) -> list[str]:
    """Each settings as one line, `compact`, each key by its last part (`seed`, `lr`) unless that part is
    another key's too (`callbacks.early_stopping.patience`, `model.scheduler.patience`)."""
    short = [compact(each) for each in settings]
    keys = list(dict.fromkeys(key for each in short for key in each))
    last = [key.rsplit(".", 1)[-1] for key in keys]
    names = {key: part if last.count(part) == 1 else key for key, part in zip(keys, last, strict=True)}
    return [
        ", ".join(f"{names[key]}={_short_number(value)}" for key, value in each.items()) for each in short
    ]


def compact(settings: dict[str, str]) -> dict[str, str]:
    """The settings with an object whose class differs shown by its class name (`model.net: MLP`) instead of
    its `_target_` and every argument that follows from that choice: for labels and the console."""
    chosen = {
        key.removesuffix("._target_"): value.rsplit(".", 1)[-1]
        for key, value in settings.items()
        if key.endswith("._target_")
    }
    rest = {
        key: value
        for key, value in settings.items()
        if not key.endswith("._target_") and not any(key.startswith(f"{node}.") for node in chosen)
    }
    return chosen | rest


def file_name(metric: str) -> str:
    """`val/acc` -> `val_acc`: a metric name as part of a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", metric)


# --- helpers ------------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    """A config value as it would be written on the command line: `mlp`, `0.001`, `[256,128]`, `null`."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _short_number(text: str) -> str:
    """`0.0016834549246003507` -> `0.001683`: a sampled float, as a label shows it; anything else as it is."""
    number = _number(text)
    return f"{number:.4g}" if number is not None and "." in text else text


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def _version(name: str) -> int:
    suffix = name.removeprefix("version_")
    return int(suffix) if suffix.isdigit() else -1


def _markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    columns = list(rows[0])

    def cell(value: Any) -> str:
        text = f"{value:.6g}" if isinstance(value, float) else "" if value is None else str(value)
        return " ".join(text.split()).replace("|", "\\|")

    return [
        "| " + " | ".join(cell(c) for c in columns) + " |",
        "|" + "|".join(" --- " for _ in columns) + "|",
        *("| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows),
    ]
