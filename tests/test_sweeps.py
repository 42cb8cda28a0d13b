"""Sweeps: Hydra grid multiruns, each job in its own dir, all of them in one summary."""

import csv
import json
import statistics
from pathlib import Path

import pytest

from hydra_plugins.sweep_summary.summary import write_summary
from tests.conftest import ONE_BATCH, last_metrics, run_cli, wandb_run

DIGITS_MLP = ["data=digits", "model/net=mlp", "trainer.max_epochs=1"]


def read_summary(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "summary.csv") as file:
        return list(csv.DictReader(file))


def only_sweep_dir(log_dir: Path) -> Path:
    sweeps = list((log_dir / "train" / "multiruns").iterdir())
    assert len(sweeps) == 1, sweeps
    return sweeps[0]


# --- grid sweeps (Hydra's own sweeper) ---


@pytest.mark.slow
def test_grid_sweep_runs_every_combination_in_its_own_dir_and_summarizes_them(seeds_sweep: Path):
    # python src/train.py -m data=digits model/net=mlp,simple_cnn seed=1,2,3 trainer.max_epochs=1
    assert sorted(p.name for p in seeds_sweep.iterdir() if p.is_dir()) == ["0", "1", "2", "3", "4", "5"]
    rows = read_summary(seeds_sweep)
    assert list(rows[0]) == ["job", "status", "val/acc_best", "model/net", "seed", "error"]
    combinations = {(row["model/net"], row["seed"]) for row in rows}
    assert combinations == {(net, seed) for net in ("mlp", "simple_cnn") for seed in ("1", "2", "3")}
    for row in rows:  # each row's value is what its job logged
        assert row["status"] == "completed"
        assert float(row["val/acc_best"]) == pytest.approx(
            last_metrics(seeds_sweep / row["job"])["val/acc_best"]
        )
    values = [float(row["val/acc_best"]) for row in rows]
    assert values == sorted(values, reverse=True)  # best first (val/acc_best: maximize)


@pytest.mark.slow
def test_jobs_that_differ_only_in_their_seed_are_one_variant_with_mean_and_std(seeds_sweep: Path):
    results = [json.loads(path.read_text()) for path in seeds_sweep.glob("*/result.json")]
    with open(seeds_sweep / "variants.csv") as file:
        variants = list(csv.DictReader(file))
    assert sorted(row["model/net"] for row in variants) == ["mlp", "simple_cnn"]
    means = [float(row["val/acc_best mean"]) for row in variants]
    assert means == sorted(means, reverse=True)  # the best variant first
    for row in variants:
        runs = [r for r in results if f"model/net={row['model/net']}" in r["overrides"]]
        assert row["n"] == "3" and row["not_completed"] == "0" and row["seed"] == "1 2 3"
        for metric in ("val/acc_best", "test/acc", "train/loss"):
            values = [r["metrics"][metric] for r in runs]
            assert float(row[f"{metric} mean"]) == pytest.approx(statistics.fmean(values))
            assert float(row[f"{metric} std"]) == pytest.approx(statistics.stdev(values))
            assert float(row[f"{metric} min"]) == pytest.approx(min(values))
            assert float(row[f"{metric} max"]) == pytest.approx(max(values))
    # The final metrics of each job are those its run recorded.
    for result in results:
        record = json.loads((seeds_sweep / str(result["job"]) / "run.json").read_text())
        assert result["metrics"] == record["final_metrics"]


@pytest.mark.slow
def test_a_sweep_over_the_folds_gives_the_cross_validated_mean_and_std(tmp_path: Path, data_dir: Path):
    folds = ["data.num_folds=3", "data.fold=range(0,3)"]
    result = run_cli(
        "train", "-m", "data=digits", "model/net=mlp", *folds, *ONE_BATCH, log_dir=tmp_path, data_dir=data_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = only_sweep_dir(tmp_path)
    with open(sweep / "variants.csv") as file:
        (variant,) = csv.DictReader(file)  # one variant, three folds of it
    values = [json.loads((sweep / str(job) / "result.json").read_text())["value"] for job in range(3)]
    assert (variant["n"], variant["data.fold"]) == ("3", "0 1 2")
    assert float(variant["val/acc_best mean"]) == pytest.approx(statistics.fmean(values))
    assert float(variant["val/acc_best std"]) == pytest.approx(statistics.stdev(values))
    assert "Variants (" in result.stdout + result.stderr  # printed at the end of the sweep


def test_a_failed_grid_job_is_in_the_summary_with_its_error(tmp_path: Path, data_dir: Path):
    result = run_cli(
        "train", "-m", *DIGITS_MLP, "model.net.dropout=0.1,1.5", log_dir=tmp_path, data_dir=data_dir
    )
    assert result.returncode != 0  # Hydra's grid sweeper stops after the batch that failed
    sweep = only_sweep_dir(tmp_path)
    rows = {row["model.net.dropout"]: row for row in read_summary(sweep)}
    assert rows["0.1"]["status"] == "completed"
    assert rows["1.5"]["status"] == "failed"
    assert rows["1.5"]["error"] == "ValueError: dropout probability has to be between 0 and 1, but got 1.5"
    # The failed job's traceback is in its own log file.
    assert "Traceback" in (sweep / rows["1.5"]["job"] / "train.log").read_text()


def test_variants_count_failed_repeats_without_averaging_them(tmp_path: Path):
    # The result.json of a search over `seed` among its values: trials 0-2 repeat lr=0.1.
    results = [
        (0, "completed", ["lr=0.1", "seed=1"], {"val/loss": 0.5, "test/loss": 0.6}),
        (1, "completed", ["lr=0.1", "seed=2"], {"val/loss": 0.3, "test/loss": 0.4}),
        (2, "failed", ["lr=0.1", "seed=3"], {}),
        (3, "completed", ["lr=0.2", "seed=1"], {"val/loss": 0.2, "test/loss": 0.1}),
    ]
    for job, status, overrides, metrics in results:
        (tmp_path / str(job)).mkdir()
        value = metrics.get("val/loss")
        result = {"job": job, "status": status, "metric": "val/loss", "value": value, "overrides": overrides}
        (tmp_path / str(job) / "result.json").write_text(
            json.dumps(result | {"error": None, "metrics": metrics})
        )
    write_summary(tmp_path, mode="min")
    with open(tmp_path / "variants.csv") as file:
        variants = list(csv.DictReader(file))
    assert [(v["lr"], v["n"], v["not_completed"], v["seed"]) for v in variants] == [
        ("0.2", "1", "0", "1"),  # the lowest mean val/loss first
        ("0.1", "2", "1", "1 2 3"),
    ]
    assert float(variants[1]["val/loss mean"]) == pytest.approx(0.4)
    assert float(variants[1]["test/loss std"]) == pytest.approx(statistics.stdev([0.6, 0.4]))
    assert variants[0]["val/loss std"] == ""  # one run has no spread


def test_summary_orders_by_the_direction_and_lists_only_what_varies(tmp_path: Path):
    results = [
        (0, "completed", 0.30, ["a=1", "seed=1"], None),
        (1, "failed", None, ["a=2", "seed=1"], "ValueError: bad"),
        (2, "completed", 0.10, ["a=3", "seed=1"], None),
        (3, "pruned", None, ["a=4", "seed=1"], "TrialPruned: pruned after epoch 0"),
    ]
    for job, status, value, overrides, error in results:
        (tmp_path / str(job)).mkdir()
        result = {"job": job, "status": status, "metric": "val/loss", "value": value, "overrides": overrides}
        (tmp_path / str(job) / "result.json").write_text(json.dumps(result | {"error": error}))
    rows, _ = write_summary(tmp_path, mode="min")
    assert [row["job"] for row in rows] == [2, 0, 3, 1]  # lowest loss first, then pruned, then failed
    assert list(rows[0]) == ["job", "status", "val/loss", "a", "error"]  # seed=1 is the same everywhere
    assert read_summary(tmp_path)[3]["error"] == "ValueError: bad"


# --- loggers under a multirun ---


@pytest.mark.slow
def test_each_job_of_a_sweep_is_its_own_wandb_run_in_the_sweeps_group(tmp_path: Path, data_dir: Path):
    overrides = [*DIGITS_MLP, "model.optimizer.lr=0.001,0.01", "logger=wandb", "logger.wandb.offline=true"]
    result = run_cli("train", "-m", *overrides, log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = only_sweep_dir(tmp_path)
    runs = [wandb_run(sweep / job)["run"] for job in ("0", "1")]
    assert [run.run_group for run in runs] == [sweep.name, sweep.name]
    assert len({run.run_id for run in runs}) == 2
    assert "model.optimizer.lr=0.001" in runs[0].display_name  # named after the job's overrides
    assert "model.optimizer.lr=0.01" in runs[1].display_name
