"""Sweeps: Hydra grid multiruns and Optuna studies, each job in its own dir, all of them in one summary."""

import csv
import json
import re
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.optuna_sweeper.optuna_sweeper import parse_search
from hydra_plugins.sweep_summary import write_summary
from tests.conftest import ONE_BATCH, built_once, last_metrics, run_cli, start_cli, wandb_run

DIGITS_MLP = ["data=digits", "model/net=mlp", "trainer.max_epochs=1"]
# A rigged pruner: any trial whose val/acc_best is below 0.5 after an epoch is hopeless.
THRESHOLD_PRUNER = [
    "~hydra.sweeper.pruner",
    "+hydra.sweeper.pruner={_target_: optuna.pruners.ThresholdPruner, lower: 0.5}",
]


def optuna_sweep(*overrides: str, log_dir: Path, data_dir: Path) -> subprocess.CompletedProcess:
    """`python src/train.py -m hparams_search=digits_mlp ...` with one-epoch trials unless overridden."""
    return run_cli("train", "-m", "hparams_search=digits_mlp", *overrides, log_dir=log_dir, data_dir=data_dir)


def study_dir(log_dir: Path) -> Path:
    return log_dir / "train" / "studies" / "digits_mlp"


def load_study(log_dir: Path) -> optuna.Study:
    return optuna.load_study(study_name="digits_mlp", storage=f"sqlite:///{study_dir(log_dir)}/optuna.db")


def trials_in(log_dir: Path, state: TrialState) -> list[optuna.trial.FrozenTrial]:
    return [trial for trial in load_study(log_dir).trials if trial.state == state]


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
    # The result.json of an Optuna study that searches `seed` among its values: trials 0-2 repeat lr=0.1.
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
    rows = write_summary(tmp_path, mode="min")
    assert [row["job"] for row in rows] == [2, 0, 3, 1]  # lowest loss first, then pruned, then failed
    assert list(rows[0]) == ["job", "status", "val/loss", "a", "error"]  # seed=1 is the same everywhere
    assert read_summary(tmp_path)[3]["error"] == "ValueError: bad"


# --- Optuna studies (hparams_search=..., hydra_plugins/optuna_sweeper) ---


def test_search_space_uses_hydras_override_grammar():
    params = OmegaConf.create(
        {
            "lr": "tag(log, interval(1e-4, 1e-1))",
            "width": "tag(int, interval(8, 256))",
            "depth": "range(1, 5)",
            "ratio": "range(0.1, 0.5, 0.1)",
            "dropout": "interval(0, 0.5)",
            "channels": "choice([16, 32], [32, 64])",
            "model/net": "choice(mlp, simple_cnn)",
        }
    )
    space, fixed = parse_search(params, ["trainer.max_epochs=3", "data.batch_size=32,64", "dropout=0.2"])
    dists = space.distributions
    assert dists["lr"] == optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)
    assert dists["width"] == optuna.distributions.IntDistribution(8, 256)
    assert dists["depth"] == optuna.distributions.IntDistribution(1, 4)  # Hydra's range excludes its end
    assert dists["ratio"] == optuna.distributions.FloatDistribution(0.1, 0.4, step=0.1)
    assert dists["data.batch_size"] == optuna.distributions.CategoricalDistribution([32, 64])
    assert "dropout" not in dists and fixed == [
        "trainer.max_epochs=3",
        "dropout=0.2",
    ]  # the command line wins
    assert space.override("channels", "[32,64]") == "channels=[32,64]"  # a list choice goes back as a list
    assert space.override("model/net", "mlp") == "model/net=mlp"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tag(log, range(1, 5))", "a range has a fixed step and cannot be log"),
        ("tag(log, interval(0, 1))", "a log interval needs a positive lower bound, got 0"),
        ("range(5, 1)", "range(5, 1, 1) is empty"),
    ],
)
def test_a_bad_search_space_says_which_key(value: str, message: str):
    with pytest.raises(ValueError, match=rf"^lr: .*{re.escape(message)}"):
        parse_search(OmegaConf.create({"lr": value}), [])


@pytest.fixture(scope="session")
def study(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """The log dir of one finished Optuna study of two one-epoch trials, and its output in output.txt. Tests
    that continue it or run more against it work on a copy (`copy_of`)."""

    def search(log_dir: Path) -> None:
        result = optuna_sweep("hydra.sweeper.n_trials=2", log_dir=log_dir, data_dir=data_dir)
        assert result.returncode == 0, result.stderr[-3000:]
        (log_dir / "output.txt").write_text(result.stdout + result.stderr)

    return built_once(tmp_path_factory, "study", search)


def copy_of(study: Path, tmp_path: Path) -> Path:
    shutil.copytree(study / "train", tmp_path / "train")
    return tmp_path


@pytest.mark.slow
def test_optuna_search_stores_the_study_and_summarizes_its_trials(study: Path):
    output = (study / "output.txt").read_text()
    assert "alembic" not in output  # no database-layer noise

    trials = load_study(study).trials
    assert [(t.number, t.state) for t in trials] == [(n, TrialState.COMPLETE) for n in range(2)]
    searched = {"model.optimizer.lr", "model.net.hidden_sizes", "model.net.dropout", "data.batch_size"}
    assert set(trials[0].params) == searched
    rows = {int(row["job"]): row for row in read_summary(study_dir(study))}
    for trial in trials:  # trial N ran as job N, with the trial's values, and returned its value
        job_dir = study_dir(study) / str(trial.number)
        overrides = OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")
        assert f"model.optimizer.lr={trial.params['model.optimizer.lr']}" in overrides
        assert f"model.net.hidden_sizes={trial.params['model.net.hidden_sizes']}" in overrides
        assert trial.value == pytest.approx(last_metrics(job_dir)["val/acc_best"])
        assert float(rows[trial.number]["val/acc_best"]) == pytest.approx(trial.value)
    best = load_study(study).best_trial.number
    assert int(read_summary(study_dir(study))[0]["job"]) == best
    assert f"Best trial {best}" in output


@pytest.mark.slow
def test_rerunning_a_study_continues_it_without_repeating_or_overwriting_trials(
    study: Path, tmp_path: Path, data_dir: Path
):
    log_dir = copy_of(study, tmp_path)  # two trials done
    before = {n: (study_dir(log_dir) / str(n) / "result.json").read_text() for n in (0, 1)}

    second = optuna_sweep("hydra.sweeper.n_trials=4", log_dir=log_dir, data_dir=data_dir)
    assert second.returncode == 0, second.stderr[-3000:]
    trials = load_study(log_dir).trials
    assert [(t.number, t.state) for t in trials] == [(n, TrialState.COMPLETE) for n in range(4)]
    # The seeded sampler was not restarted from scratch: the new trials are not replays of the old ones.
    assert trials[2].params != trials[0].params
    assert trials[3].params != trials[1].params
    assert before == {n: (study_dir(log_dir) / str(n) / "result.json").read_text() for n in (0, 1)}
    assert len(read_summary(study_dir(log_dir))) == 4  # one summary for the whole study

    third = optuna_sweep("hydra.sweeper.n_trials=4", log_dir=log_dir, data_dir=data_dir)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "already has 4 finished trials" in third.stdout + third.stderr
    assert len(load_study(log_dir).trials) == 4


@pytest.mark.slow
def test_a_killed_sweep_resumes_with_the_same_command(tmp_path: Path, data_dir: Path):
    overrides = ["-m", "hparams_search=digits_mlp", "trainer.max_epochs=2", "hydra.sweeper.n_trials=3"]
    sweep = start_cli("train", *overrides, log_dir=tmp_path, data_dir=data_dir, output=tmp_path / "sweep.out")
    deadline = time.time() + 240
    while not (study_dir(tmp_path) / "2").exists():  # trial 2 has started
        assert sweep.poll() is None and time.time() < deadline, "the sweep ended before trial 2 started"
        time.sleep(0.05)
    sweep.send_signal(signal.SIGKILL)
    sweep.wait()

    result = run_cli("train", *overrides, log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    states = {t.number: t.state for t in load_study(tmp_path).trials}
    assert states == {
        0: TrialState.COMPLETE,
        1: TrialState.COMPLETE,
        2: TrialState.FAIL,
        3: TrialState.COMPLETE,
    }
    # The new launch finds trial 2's launch gone (its process ended), fails it and runs its values again.
    trials = load_study(tmp_path).trials
    assert trials[2].user_attrs["error"] == f"interrupted: its launch (process {sweep.pid}) ended"
    assert trials[3].user_attrs["retry_of"] == 2 and trials[3].params == trials[2].params


@pytest.mark.slow
def test_a_trial_that_raises_is_recorded_as_failed_and_the_others_finish(tmp_path: Path, data_dir: Path):
    result = optuna_sweep(
        "trainer.max_epochs=1",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.max_failure_rate=1",
        "model.net.dropout=choice(0.1,1.5)",  # 1.5 is not a probability: nn.Dropout raises
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    failed, completed = trials_in(tmp_path, TrialState.FAIL), trials_in(tmp_path, TrialState.COMPLETE)
    assert failed and len(completed) == 3
    assert all(t.params["model.net.dropout"] == 1.5 for t in failed)
    assert all(t.params["model.net.dropout"] == 0.1 for t in completed)
    message = "ValueError: dropout probability has to be between 0 and 1, but got 1.5"
    assert all(t.user_attrs["error"] == message for t in failed)
    failed_rows = [row for row in read_summary(study_dir(tmp_path)) if row["status"] == "failed"]
    assert [int(row["job"]) for row in failed_rows] == [t.number for t in failed]
    assert all(row["error"] == message for row in failed_rows)


def test_a_sweep_that_keeps_failing_stops_at_its_failure_budget(tmp_path: Path, data_dir: Path):
    result = optuna_sweep(
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.max_failure_rate=0.25",  # 1 failure of 4 allowed
        "model.net.dropout=choice(1.5,2.0)",
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode != 0
    stopped = (
        "2 trials of study digits_mlp failed in this sweep, more than hydra.sweeper.max_failure_rate=0.25"
    )
    assert stopped in result.stderr
    assert [t.state for t in load_study(tmp_path).trials] == [TrialState.FAIL, TrialState.FAIL]


@pytest.mark.slow
def test_the_pruner_stops_a_hopeless_trial_after_its_first_epoch(tmp_path: Path, data_dir: Path):
    result = optuna_sweep(
        "trainer.max_epochs=3",
        "hydra.sweeper.n_trials=3",
        "model.optimizer.lr=choice(0.000001,0.01)",  # 1e-6 learns nothing in 3 epochs
        *THRESHOLD_PRUNER,
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    pruned, completed = trials_in(tmp_path, TrialState.PRUNED), trials_in(tmp_path, TrialState.COMPLETE)
    assert pruned and completed
    for trial in pruned:
        assert trial.params["model.optimizer.lr"] == 1e-6
        assert list(trial.intermediate_values) == [0]  # reported once, then stopped
        assert "test/acc" not in last_metrics(study_dir(tmp_path) / str(trial.number))  # no test after fit
    for trial in completed:
        assert trial.params["model.optimizer.lr"] == 0.01
        assert list(trial.intermediate_values) == [0, 1, 2]  # every epoch reported
    statuses = {int(row["job"]): row["status"] for row in read_summary(study_dir(tmp_path))}
    assert statuses == {t.number: "pruned" for t in pruned} | {t.number: "completed" for t in completed}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), None])
def test_a_trial_whose_metric_is_not_a_finite_number_is_failed(value):
    from hydra.core.utils import JobReturn, JobStatus

    from hydra_plugins.optuna_sweeper.optuna_sweeper import _tell

    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    assert _tell(study, trial, JobReturn(status=JobStatus.COMPLETED, _return_value=value)) == TrialState.FAIL
    assert (
        study.trials[0].user_attrs["error"]
        == f"ValueError: the task returned {value!r}, not a finite optimized_metric"
    )


@pytest.mark.slow
def test_parallel_trials_in_other_processes_report_to_their_own_trial(tmp_path: Path, data_dir: Path):
    result = optuna_sweep(
        "hydra/launcher=submitit_local",  # each job in a process of its own
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.n_trials=2",
        "trainer.max_epochs=2",
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trials = load_study(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    for trial in trials:  # each job found its trial through the study's storage and reported to it
        assert list(trial.intermediate_values) == [0, 1]
        assert trial.intermediate_values[1] == pytest.approx(trial.value)
        assert (study_dir(tmp_path) / str(trial.number) / "result.json").exists()


@pytest.mark.slow
def test_a_pruned_ddp_trial_ends_its_workers_but_not_the_sweep(tmp_path: Path, data_dir: Path):
    result = optuna_sweep(
        "trainer=ddp_sim",
        "trainer.max_epochs=2",
        "hydra.sweeper.n_trials=2",
        "model.optimizer.lr=choice(0.000001,0.01)",
        *THRESHOLD_PRUNER,
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Forcefully terminating all other processes" not in output  # Lightning did not kill the sweep
    trials = load_study(tmp_path).trials
    assert {t.state for t in trials} == {TrialState.PRUNED, TrialState.COMPLETE}
    assert output.count("[rank: 1] Seed set to") == len(trials)  # each trial started its own worker


@pytest.mark.slow
def test_a_pruning_monitor_that_is_never_logged_fails_the_trial_clearly(tmp_path: Path, data_dir: Path):
    result = optuna_sweep(
        "hydra.sweeper.n_trials=1",
        "hydra.sweeper.max_failure_rate=0",
        "callbacks.optuna_pruning.monitor=val/acc_bset",
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode != 0
    assert "callbacks.optuna_pruning.monitor=val/acc_bset was not logged; logged: " in result.stderr


@pytest.mark.slow
def test_a_study_is_not_continued_with_another_search_or_direction(
    study: Path, tmp_path: Path, data_dir: Path
):
    log_dir = copy_of(study, tmp_path)
    fixed = optuna_sweep(
        "hydra.sweeper.n_trials=3", "model.net.dropout=0.2", log_dir=log_dir, data_dir=data_dir
    )
    assert fixed.returncode != 0
    assert "was started with another setup (model.net.dropout: no longer searched)" in fixed.stderr
    assert "hydra.sweeper.study_name=<new name>" in fixed.stderr

    flipped = optuna_sweep("hydra.sweeper.n_trials=3", "mode=min", log_dir=log_dir, data_dir=data_dir)
    assert flipped.returncode != 0
    assert "direction: maximize -> minimize" in flipped.stderr
    assert len(load_study(log_dir).trials) == 2  # nothing ran


def test_a_new_study_does_not_overwrite_the_runs_of_an_earlier_one(tmp_path: Path, data_dir: Path):
    old_run = study_dir(tmp_path) / "0"
    (old_run / ".hydra").mkdir(parents=True)
    (old_run / "result.json").write_text("{}")
    result = optuna_sweep("hydra.sweeper.n_trials=1", log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode != 0
    assert f"{study_dir(tmp_path)} already holds the runs 0 of an earlier sweep" in result.stderr
    assert (old_run / "result.json").read_text() == "{}"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("mode=up", "mode=up is not valid; choose max or min"),
        ("hydra.sweeper.n_trials=0", "hydra.sweeper.n_trials=0 and n_jobs=1 must both be at least 1"),
        ("hydra.sweeper.max_failure_rate=2", "hydra.sweeper.max_failure_rate=2 must be between 0 and 1"),
        ("hydra.sweeper.storage=study.db", "hydra.sweeper.storage=study.db is neither a database URL"),
        (
            "hydra.sweeper.grace_period=10",
            "heartbeat_interval=30 and grace_period=10: give 0 < heartbeat_interval",
        ),
        ("hydra.sweeper.stale_retries=-1", "hydra.sweeper.stale_retries=-1 must be 0 or more"),
    ],
)
def test_bad_sweeper_settings_are_refused_before_any_trial(tmp_path: Path, data_dir: Path, override, message):
    result = optuna_sweep(override, log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode != 0
    assert message in result.stderr
    assert not study_dir(tmp_path).exists()


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
