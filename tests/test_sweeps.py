"""Sweeps: Hydra grid multiruns, each job in its own dir, all of them in one summary."""

import csv
import json
import statistics
from pathlib import Path

import pytest

from hydra_plugins.sweep_summary.summary import write_summary
from tests.conftest import ONE_BATCH, built_once, last_metrics, run_cli

STATISTICS = {"mean": statistics.fmean, "std": statistics.stdev, "min": min, "max": max}


@pytest.fixture(scope="session")
def seeds_sweep(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """The sweep dir of `python src/train.py -m data=digits model/net=mlp,simple_cnn seed=1,2,3
    trainer.max_epochs=1`, the README's mean ± std over seeds, run once for the session; its output in
    output.txt beside `train/`."""

    def sweep(log_dir: Path) -> None:
        grid = ["data=digits", "model/net=mlp,simple_cnn", "seed=1,2,3", "trainer.max_epochs=1"]
        result = run_cli("train", "-m", *grid, log_dir=log_dir, data_dir=data_dir)
        assert result.returncode == 0, result.stderr[-3000:]
        (log_dir / "output.txt").write_text(result.stdout + result.stderr)

    (sweep_dir,) = (built_once(tmp_path_factory, "seeds_sweep", sweep) / "train" / "multiruns").iterdir()
    return sweep_dir


def read_summary(sweep_dir: Path, name: str = "summary.csv") -> list[dict[str, str]]:
    with open(sweep_dir / name) as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_a_grid_sweep_runs_each_job_in_its_own_dir_and_summarizes_jobs_and_seed_variants(seeds_sweep: Path):
    rows = read_summary(seeds_sweep)
    assert list(rows[0]) == ["job", "status", "val/acc_best", "model/net", "seed", "error"]
    combinations = {(row["model/net"], row["seed"]) for row in rows}
    assert combinations == {(net, seed) for net in ("mlp", "simple_cnn") for seed in ("1", "2", "3")}
    for row in rows:  # each row's value is what its job logged
        logged = last_metrics(seeds_sweep / row["job"])["val/acc_best"]
        assert row["status"] == "completed" and float(row["val/acc_best"]) == pytest.approx(logged)
    values = [float(row["val/acc_best"]) for row in rows]
    assert values == sorted(values, reverse=True)  # best first (val/acc_best: maximize)
    # Jobs that differ only in their seed are one variant, with the mean, std, min and max of its runs.
    assert "Variants (" in (seeds_sweep.parents[2] / "output.txt").read_text()  # printed at the sweep's end
    variants = read_summary(seeds_sweep, "variants.csv")
    assert sorted(row["model/net"] for row in variants) == ["mlp", "simple_cnn"]
    means = [float(row["val/acc_best mean"]) for row in variants]
    assert means == sorted(means, reverse=True)  # the best variant first
    for row in variants:
        jobs = [job["job"] for job in rows if job["model/net"] == row["model/net"]]
        runs = [json.loads((seeds_sweep / job / "run.json").read_text())["final_metrics"] for job in jobs]
        assert row["n"] == "3" and row["not_completed"] == "0" and row["seed"] == "1 2 3"
        for metric in ("val/acc_best", "test/acc", "train/loss"):
            values = [run[metric] for run in runs]  # what the runs recorded
            for name, statistic in STATISTICS.items():
                assert float(row[f"{metric} {name}"]) == pytest.approx(statistic(values))


@pytest.mark.slow
def test_a_sweep_over_the_folds_gives_each_variants_mean_and_std_and_failed_jobs_with_their_error(
    tmp_path: Path, data_dir: Path
):
    # Three folds of two variants: dropout=1.5 is not a probability, so each of its jobs fails.
    folds = ["data.num_folds=3", "data.fold=range(0,3)", "model.net.dropout=0.1,1.5", *ONE_BATCH]
    result = run_cli(
        "train", "-m", "data=digits", "model/net=mlp", *folds, log_dir=tmp_path, data_dir=data_dir
    )
    assert result.returncode != 0  # Hydra's grid sweeper stops after the batch that failed
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    rows = read_summary(sweep)
    statuses = {(row["model.net.dropout"], row["status"]) for row in rows}
    assert statuses == {("0.1", "completed"), ("1.5", "failed")}
    failed = [row for row in rows if row["status"] == "failed"]
    message = "ValueError: dropout probability has to be between 0 and 1, but got 1.5"
    assert len(failed) == 3 and all(row["error"] == message for row in failed)
    assert "Traceback" in (sweep / failed[0]["job"] / "train.log").read_text()  # in the job's own log
    variants = {row["model.net.dropout"]: row for row in read_summary(sweep, "variants.csv")}
    kept, failing = variants["0.1"], variants["1.5"]
    assert (kept["n"], kept["data.fold"]) == ("3", "0 1 2")  # its mean and std: as over seeds
    assert (failing["n"], failing["not_completed"]) == ("0", "3")


def test_the_summary_puts_the_best_first_and_averages_only_the_completed_repeats(tmp_path: Path):
    assert write_summary(tmp_path, mode="min") == ([], [])  # no job has finished yet: nothing to write
    jobs = [  # the result.json of a search over lr, and over seed among its values: lr=0.1 repeats
        ("completed", ["lr=0.1", "seed=1", "data=x"], {"val/loss": 0.5, "test/loss": 0.6}, None),
        ("completed", ["lr=0.1", "seed=2", "data=x"], {"val/loss": 0.3, "test/loss": 0.4}, None),
        ("failed", ["lr=0.1", "seed=3", "data=x"], {}, "ValueError: bad"),
        ("completed", ["lr=0.2", "seed=1", "data=x"], {"val/loss": 0.2, "test/loss": 0.1}, None),
        ("pruned", ["lr=0.3", "seed=1", "data=x"], {}, "TrialPruned: pruned after epoch 0"),
    ]
    for job, (status, overrides, metrics, error) in enumerate(jobs):
        (tmp_path / str(job)).mkdir()
        result = {"job": job, "status": status, "metric": "val/loss", "value": metrics.get("val/loss")}
        result |= {"overrides": overrides, "error": error, "metrics": metrics}
        (tmp_path / str(job) / "result.json").write_text(json.dumps(result))
    rows, _ = write_summary(tmp_path, mode="min")
    assert [row["job"] for row in rows] == [3, 1, 0, 4, 2]  # lowest loss first, then pruned, then failed
    assert list(rows[0]) == ["job", "status", "val/loss", "lr", "seed", "error"]  # data=x is everywhere
    variants = read_summary(tmp_path, "variants.csv")
    best_mean_first = [("0.2", "1", "0", "1"), ("0.1", "2", "1", "1 2 3"), ("0.3", "0", "1", "1")]
    assert [(v["lr"], v["n"], v["not_completed"], v["seed"]) for v in variants] == best_mean_first
    assert float(variants[1]["val/loss mean"]) == pytest.approx(0.4)
    assert float(variants[1]["test/loss std"]) == pytest.approx(statistics.stdev([0.6, 0.4]))
    assert variants[0]["val/loss std"] == ""  # one run has no spread
