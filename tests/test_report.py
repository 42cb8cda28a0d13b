"""`python src/report.py`: a table and plots across runs, sweeps and studies, from their run dirs alone."""

import csv
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, built_once, cli_command, cli_env, only_run_dir, run_cli

# Two epochs of a few batches: a curve of two points per run, in about a second a job.
FEW_BATCHES = [
    "data=digits",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=1",
]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="session")
def sweep(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """A sweep dir: two variants, the MLP (jobs 0, 1) and the CNN (2, 3), over two seeds each."""

    def train(log_dir: Path) -> None:
        overrides = ["-m", "model/net=mlp,simple_cnn", "seed=1,2", *FEW_BATCHES]
        result = run_cli("train", *overrides, log_dir=log_dir, data_dir=data_dir)
        assert result.returncode == 0, result.stderr[-3000:]

    (sweep_dir,) = (built_once(tmp_path_factory, "report_sweep", train) / "train" / "multiruns").iterdir()
    return sweep_dir


@pytest.fixture(scope="module")
def without_torch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for PYTHONPATH in which `torch` and `lightning` fail to import: the report reads files only."""
    folder = tmp_path_factory.mktemp("without_torch")
    for package in ("torch", "lightning"):
        (folder / package).mkdir()
        (folder / package / "__init__.py").write_text(f"raise ImportError('the report imported {package}')\n")
    check = subprocess.run(
        [sys.executable, "-c", "import torch"],
        env=cli_env(PYTHONPATH=str(folder)),
        capture_output=True,
        text=True,
    )
    assert "the report imported torch" in check.stderr  # the block works
    return folder


def report_cli(
    *overrides: str, log_dir: Path, data_dir: Path, blocked: Path, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """`python src/report.py overrides...` as a new process that cannot import torch or Lightning (0.4 s a
    command)."""
    command = cli_command("report", *overrides, log_dir=log_dir, data_dir=data_dir)
    env = cli_env(PYTHONPATH=str(blocked))
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def logged(run_dir: Path, metric: str) -> list[float]:
    """Every value of `metric` in the run's CSV log."""
    rows = read_csv(run_dir / "csv" / "version_0" / "metrics.csv")
    return [float(row[metric]) for row in rows if row.get(metric)]


def test_a_report_of_a_sweep_and_a_run_tabulates_and_plots_them_without_torch(
    sweep: Path, digits_run: Path, without_torch: Path, tmp_path: Path, data_dir: Path
):
    runs = f"runs=[train/multiruns/*,{digits_run}]"  # a glob relative to where the command starts, and a run
    metrics = "metrics=[val/acc,val/loss]"
    logs = sweep.parents[2]  # <logs>/train/multiruns/<sweep>
    result = report_cli(runs, metrics, log_dir=tmp_path, data_dir=data_dir, blocked=without_torch, cwd=logs)
    assert result.returncode == 0, result.stderr[-3000:]
    out = only_run_dir(tmp_path, "report")
    assert f"Wrote {out / 'report.md'}" in result.stdout + result.stderr

    names = ["curves_val_acc", "curves_val_loss", "variants_val_acc", "variants_val_loss"]
    for name in names:
        picture = (out / f"{name}.png").read_bytes()
        assert picture.startswith(PNG) and len(picture) > 1000, name

    # One row per run, the sweep's jobs by number, then the run; the numbers are the runs' own.
    jobs = [sweep / str(number) for number in range(4)]
    rows = read_csv(out / "report.csv")
    assert [Path(row["path"]) for row in rows] == [*jobs, digits_run]
    assert [row["source"] for row in rows] == [sweep.name] * 4 + [""]
    for row in rows:
        record = json.loads((Path(row["path"]) / "run.json").read_text())
        assert row["status"] == "completed"
        assert float(row["val/acc"]) == record["final_metrics"]["val/acc"]
        assert float(row["val/loss"]) == record["final_metrics"]["val/loss"]
        assert float(row["val/acc best"]) == max(logged(Path(row["path"]), "val/acc"))
        assert float(row["val/loss best"]) == min(logged(Path(row["path"]), "val/loss"))  # a loss: min
        assert row["git"] == (record["git"]["commit"] or "")[:7] + (
            "-dirty" if record["git"]["dirty"] else ""
        )
    # The config keys that differ, and none that are about where files go.
    assert {"seed", "model.net._target_", "trainer.limit_train_batches"} <= set(rows[0])
    assert not [key for key in rows[0] if key.startswith(("paths.", "logger.")) or "dirpath" in key]

    # Each net is one variant repeated over two seeds; its statistics are those of its jobs' results.
    variants = read_csv(out / "variants.csv")
    assert sorted((row["n"], row["not_completed"], row["seed"]) for row in variants) == [
        ("1", "0", "42"),
        ("2", "0", "1 2"),
        ("2", "0", "1 2"),
    ]
    for variant_jobs in (jobs[:2], jobs[2:]):
        results = [json.loads((job / "result.json").read_text()) for job in variant_jobs]
        net = next(o for o in results[0]["overrides"] if o.startswith("model/net=")).partition("=")[2]
        (row,) = [row for row in variants if row["seed"] == "1 2" and f".{net}." in row["model.net._target_"]]
        values = [result["metrics"]["val/acc"] for result in results]
        assert float(row["val/acc mean"]) == pytest.approx(statistics.fmean(values), rel=1e-12)
        assert float(row["val/acc std"]) == pytest.approx(statistics.stdev(values), rel=1e-12)

    report = (out / "report.md").read_text()
    assert (
        "## Runs" in report
        and "## Variants" in report
        and "![curves_val_acc.png](curves_val_acc.png)" in report
    )
    assert all(f"| {row['run']} |" in report for row in rows)


def test_a_failed_run_and_a_run_without_a_csv_log_are_listed_with_a_warning(
    sweep: Path, without_torch: Path, tmp_path: Path, data_dir: Path
):
    sweep = shutil.copytree(sweep, tmp_path / "sweep", ignore=shutil.ignore_patterns("2", "3"))  # the MLP's
    record = json.loads((sweep / "1" / "run.json").read_text())
    record |= {"status": "failed", "error": "RuntimeError: out of memory", "final_metrics": None}
    (sweep / "1" / "run.json").write_text(json.dumps(record))
    shutil.rmtree(sweep / "0" / "csv")  # as if it had logged to wandb only

    result = report_cli(f"runs={sweep}", log_dir=tmp_path / "logs", data_dir=data_dir, blocked=without_torch)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "sweep/1 failed: RuntimeError: out of memory" in output
    assert "sweep/0 has no CSV log" in output
    out = only_run_dir(tmp_path / "logs", "report")
    rows = read_csv(out / "report.csv")
    assert [(row["run"], row["status"], row["error"]) for row in rows] == [
        ("sweep/0", "completed", ""),
        ("sweep/1", "failed", "RuntimeError: out of memory"),
    ]
    # metrics=null: the runs' optimized_metric; the failed run has no final value, but its log has a best.
    assert rows[1]["val/acc_best"] == "" and rows[1]["val/acc_best best"] != ""
    assert rows[0]["val/acc_best best"] == ""
    (variant,) = read_csv(out / "variants.csv")
    assert (variant["n"], variant["not_completed"]) == ("1", "1")
    assert (out / "curves_val_acc_best.png").read_bytes().startswith(PNG)  # the failed run's curve


def test_a_metric_no_run_logged_fails_in_one_line_before_anything_is_written(
    digits_run: Path, without_torch: Path, tmp_path: Path, data_dir: Path
):
    """A refusal as the command line shows it, before any report file is written; the other bad `runs=` and
    `metrics=` are refused by the same functions, which the next test calls directly."""
    result = report_cli(
        f"runs={digits_run}",
        "metrics=[val/acc,val/nope]",
        log_dir=tmp_path / "logs",
        data_dir=data_dir,
        blocked=without_torch,
    )
    assert result.returncode != 0
    assert (
        "metrics=val/nope: no run logged it; logged metrics: lr-Adam, test/acc, test/loss, train/acc"
        in result.stderr
    )
    assert not list((tmp_path / "logs").glob("report/runs/*/report.*"))


def test_what_runs_and_metrics_mean_and_the_rest_of_bad_input(digits_run: Path, tmp_path: Path):
    """The same functions as the command line, called directly (milliseconds instead of a process each)."""
    from src.run_comparison import chosen_metrics, find_runs, metric_modes

    with pytest.raises(ValueError, match=r"^runs= is empty; give run dirs, sweep or study dirs, or globs"):
        find_runs([], tmp_path)
    with pytest.raises(ValueError, match=r"^runs=nothing\* matches nothing \(relative paths start from "):
        find_runs("nothing*", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^runs=/nowhere/sweep: /nowhere/sweep does not exist$"):
        find_runs("/nowhere/sweep", tmp_path)
    with pytest.raises(
        ValueError,
        match=rf"^runs={tmp_path}: {tmp_path} is no run dir and holds none; a run dir holds run.json",
    ):
        find_runs(str(tmp_path), tmp_path)
    runs = find_runs(str(digits_run), tmp_path)  # one path, no list
    assert [run.name for run in runs] == ["mlp"] and runs[0].source == ""
    assert chosen_metrics(None, runs) == ["val/acc_best"]  # the runs' optimized_metric
    # The runs' mode for the metric they watch, min for a loss, max for the rest; or as given.
    names = ["val/acc", "val/acc_best", "val/loss", "train/acc"]
    assert metric_modes(names, None, runs) == {
        "val/acc": "max",
        "val/acc_best": "max",
        "val/loss": "min",
        "train/acc": "max",
    }
    assert set(metric_modes(names, "min", runs).values()) == {"min"}
    assert metric_modes(names, {"val/acc": "min"}, runs)["val/acc"] == "min"
    with pytest.raises(ValueError, match=r"^mode=up \(for val/acc\) is not valid; choose max or min$"):
        metric_modes(names, "up", runs)
    with pytest.raises(ValueError, match=r"^mode names val/mae, not among metrics=\[val/acc,"):
        metric_modes(names, {"val/mae": "min"}, runs)
