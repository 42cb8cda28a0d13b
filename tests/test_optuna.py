"""Optuna studies (hparams_search=..., hydra_plugins/optuna_sweeper): the search space, the stored study,
continuing and resuming it, failed and pruned trials, and bad settings."""

import logging
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from optuna.study import StudyDirection
from optuna.trial import TrialState

from hydra_plugins.optuna_sweeper.optuna_sweeper import parse_search
from src import api
from tests.conftest import built_once, last_metrics, run_cli, start_cli
from tests.test_sweeps import read_summary
from tests.test_watched_metric import WATCH_LOSS, logged

# A rigged pruner: any trial whose val/acc_best is below 0.5 after an epoch is hopeless.
THRESHOLD_PRUNER = [
    "~hydra.sweeper.pruner",
    "+hydra.sweeper.pruner={_target_: optuna.pruners.ThresholdPruner, lower: 0.5}",
]


def optuna_sweep(*overrides: str, log_dir: Path, data_dir: Path) -> subprocess.CompletedProcess:
    """`python src/train.py -m hparams_search=digits_mlp ...`."""
    return run_cli("train", "-m", "hparams_search=digits_mlp", *overrides, log_dir=log_dir, data_dir=data_dir)


def sweep_here(log_dir: Path, *overrides: str) -> None:
    """The start of `python src/train.py -m hparams_search=digits_mlp ...` in this process, for the sweeper's
    checks before its first trial: the sweeper that the config builds, given the command's task overrides."""
    cfg = api.compose("train", ["hparams_search=digits_mlp", f"paths.log_dir={log_dir}", *overrides])
    sweeper = instantiate(cfg.hydra.sweeper)
    sweeper.config = cfg
    sweeper.sweep(list(cfg.hydra.overrides.task))


def study_dir(log_dir: Path) -> Path:
    return log_dir / "train" / "studies" / "digits_mlp"


def load_study(log_dir: Path) -> optuna.Study:
    return optuna.load_study(study_name="digits_mlp", storage=f"sqlite:///{study_dir(log_dir)}/optuna.db")


def trials_in(log_dir: Path, state: TrialState) -> list[optuna.trial.FrozenTrial]:
    return [trial for trial in load_study(log_dir).trials if trial.state == state]


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
    """The log dir of one finished Optuna study of two two-epoch trials that minimize val/loss
    (`monitor=val/loss mode=min`), and its output in output.txt. Tests that run more against it work on a copy
    (`copy_of`)."""

    def search(log_dir: Path) -> None:
        overrides = ["hydra.sweeper.n_trials=2", "trainer.max_epochs=2", *WATCH_LOSS]
        result = optuna_sweep(*overrides, log_dir=log_dir, data_dir=data_dir)
        assert result.returncode == 0, result.stderr[-3000:]
        (log_dir / "output.txt").write_text(result.stdout + result.stderr)

    return built_once(tmp_path_factory, "study", search)


def copy_of(study: Path, tmp_path: Path) -> Path:
    shutil.copytree(study / "train", tmp_path / "train")
    return tmp_path


@pytest.mark.slow
def test_optuna_search_stores_the_study_and_summarizes_its_trials_best_first_as_the_mode_says(study: Path):
    output = (study / "output.txt").read_text()
    assert "alembic" not in output  # no database-layer noise

    stored = load_study(study)
    assert stored.direction == StudyDirection.MINIMIZE  # mode=min
    trials = stored.trials
    assert [(t.number, t.state) for t in trials] == [(n, TrialState.COMPLETE) for n in range(2)]
    searched = {"model.optimizer.lr", "model.net.hidden_sizes", "model.net.dropout", "data.batch_size"}
    assert set(trials[0].params) == searched
    rows = {int(row["job"]): row for row in read_summary(study_dir(study))}
    for trial in trials:  # trial N ran as job N, with the trial's values, and returned its value
        job_dir = study_dir(study) / str(trial.number)
        overrides = OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")
        assert f"model.optimizer.lr={trial.params['model.optimizer.lr']}" in overrides
        assert f"model.net.hidden_sizes={trial.params['model.net.hidden_sizes']}" in overrides
        # It returned, and reported to the pruner after each epoch, its lowest val/loss so far.
        losses = logged(job_dir, "val/loss")
        assert trial.value == pytest.approx(min(losses)) == last_metrics(job_dir)["val/loss_best"]
        assert trial.intermediate_values == pytest.approx({0: losses[0], 1: min(losses)})
        assert float(rows[trial.number]["val/loss_best"]) == pytest.approx(trial.value)
    values = [float(row["val/loss_best"]) for row in read_summary(study_dir(study))]
    assert values == sorted(values)  # best (lowest) first
    best = stored.best_trial.number
    assert int(read_summary(study_dir(study))[0]["job"]) == best
    assert f"Best trial {best}" in output


@pytest.mark.slow
def test_a_killed_sweep_resumes_with_the_same_command_and_continues_its_study(
    tmp_path: Path, data_dir: Path, caplog: pytest.LogCaptureFixture
):
    overrides = ["-m", "hparams_search=digits_mlp", "trainer.max_epochs=2", "hydra.sweeper.n_trials=4"]
    sweep = start_cli("train", *overrides, log_dir=tmp_path, data_dir=data_dir, output=tmp_path / "sweep.out")
    deadline = time.time() + 240
    while not (study_dir(tmp_path) / "2").exists():  # trial 2 has started
        assert sweep.poll() is None and time.time() < deadline, "the sweep ended before trial 2 started"
        time.sleep(0.05)
    sweep.send_signal(signal.SIGKILL)
    sweep.wait()
    before = {n: (study_dir(tmp_path) / str(n) / "result.json").read_text() for n in (0, 1)}

    result = run_cli("train", *overrides, log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    trials = load_study(tmp_path).trials
    complete, failed = TrialState.COMPLETE, TrialState.FAIL
    assert [t.state for t in trials] == [complete, complete, failed, complete, complete]
    # The new launch finds trial 2's launch gone (its process ended), fails it and runs its values again,
    assert trials[2].user_attrs["error"] == f"interrupted: its launch (process {sweep.pid}) ended"
    assert trials[3].user_attrs["retry_of"] == 2 and trials[3].params == trials[2].params
    # then new values: its seeded sampler did not start over, replaying the first launch's trials.
    assert trials[4].params != trials[0].params
    assert before == {n: (study_dir(tmp_path) / str(n) / "result.json").read_text() for n in (0, 1)}
    jobs = sorted(row["job"] for row in read_summary(study_dir(tmp_path)))
    assert jobs == ["0", "1", "3", "4"]  # one summary of both launches' trials (trial 2 was killed)

    caplog.set_level(logging.INFO)  # the same command once n_trials have finished runs nothing
    sweep_here(tmp_path, "trainer.max_epochs=2", "hydra.sweeper.n_trials=4")
    assert "already has 4 finished trials" in caplog.text
    assert len(load_study(tmp_path).trials) == 5


@pytest.mark.slow
def test_a_trial_that_raises_is_recorded_as_failed_and_the_others_finish(tmp_path: Path, data_dir: Path):
    result = optuna_sweep(
        "trainer.max_epochs=1",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.max_failure_rate=1",
        "model.net.dropout=choice(0.1,1.5)",  # 1.5 is not a probability: nn.Dropout raises
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    failed, completed = trials_in(tmp_path, TrialState.FAIL), trials_in(tmp_path, TrialState.COMPLETE)
    assert failed and len(completed) == 2
    assert all(t.params["model.net.dropout"] == 1.5 for t in failed)
    assert all(t.params["model.net.dropout"] == 0.1 for t in completed)
    message = "ValueError: dropout probability has to be between 0 and 1, but got 1.5"
    assert all(t.user_attrs["error"] == message for t in failed)
    failed_rows = [row for row in read_summary(study_dir(tmp_path)) if row["status"] == "failed"]
    assert [int(row["job"]) for row in failed_rows] == [t.number for t in failed]
    assert all(row["error"] == message for row in failed_rows)


@pytest.mark.slow
def test_trials_that_keep_failing_say_why_until_the_failure_budget_stops_the_sweep(
    tmp_path: Path, data_dir: Path
):
    result = optuna_sweep(
        "trainer.max_epochs=1",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.max_failure_rate=0.25",  # 1 failure of 4 allowed
        "callbacks.optuna_pruning.monitor=val/acc_bset",  # a typo: each trial fails at its first validation
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode != 0
    stopped = (
        "2 trials of study digits_mlp failed in this sweep, more than hydra.sweeper.max_failure_rate=0.25"
    )
    assert stopped in result.stderr
    never_logged = "callbacks.optuna_pruning.monitor=val/acc_bset was not logged; logged: "
    assert never_logged in result.stderr  # the last trial's error
    trials = load_study(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]
    assert all(never_logged in t.user_attrs["error"] for t in trials)


@pytest.mark.slow
def test_the_pruner_stops_a_hopeless_ddp_trial_after_its_first_epoch_and_not_the_sweep(
    tmp_path: Path, data_dir: Path
):
    result = optuna_sweep(
        "trainer=ddp_sim",
        "trainer.max_epochs=2",
        "hydra.sweeper.n_trials=2",  # the seeded sampler draws 1e-6, then 0.01
        "model.optimizer.lr=choice(0.000001,0.01)",  # 1e-6 learns nothing in 2 epochs
        *THRESHOLD_PRUNER,
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Forcefully terminating all other processes" not in output  # Lightning did not kill the sweep
    assert output.count("[rank: 1] Seed set to") == 2  # each trial started its own worker
    pruned, completed = trials_in(tmp_path, TrialState.PRUNED), trials_in(tmp_path, TrialState.COMPLETE)
    assert pruned and completed
    for trial in pruned:
        assert trial.params["model.optimizer.lr"] == 1e-6
        assert list(trial.intermediate_values) == [0]  # reported once, then stopped
        assert "test/acc" not in last_metrics(study_dir(tmp_path) / str(trial.number))  # no test after fit
    for trial in completed:
        assert trial.params["model.optimizer.lr"] == 0.01
        assert list(trial.intermediate_values) == [0, 1]  # every epoch reported
    statuses = {int(row["job"]): row["status"] for row in read_summary(study_dir(tmp_path))}
    assert statuses == {t.number: "pruned" for t in pruned} | {t.number: "completed" for t in completed}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), None])
def test_a_trial_whose_metric_is_not_a_finite_number_is_failed(value, tmp_path: Path):
    from hydra.core.utils import JobReturn, JobStatus

    from hydra_plugins.optuna_sweeper.optuna_sweeper import StudyLock, result_of, tell

    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="study", storage=storage, direction="maximize")
    trial = study.ask()
    job = JobReturn(status=JobStatus.COMPLETED)
    job.return_value = value
    assert tell(study, trial, result_of(job), StudyLock(storage, "study")) == TrialState.FAIL
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
def test_a_study_is_not_continued_with_another_search_or_direction(study: Path, tmp_path: Path):
    log_dir = copy_of(study, tmp_path)  # mode=min
    fixed = r"was started with another setup \(model.net.dropout: no longer searched\).*study_name=<new name>"
    with pytest.raises(ValueError, match=fixed):
        sweep_here(log_dir, "hydra.sweeper.n_trials=3", *WATCH_LOSS, "model.net.dropout=0.2")
    with pytest.raises(ValueError, match="direction: minimize -> maximize"):
        sweep_here(log_dir, "hydra.sweeper.n_trials=3")  # mode=max, the default
    assert len(load_study(log_dir).trials) == 2  # nothing ran


def test_a_new_study_does_not_overwrite_the_runs_of_an_earlier_one(tmp_path: Path):
    old_run = study_dir(tmp_path) / "0"
    (old_run / ".hydra").mkdir(parents=True)
    (old_run / "result.json").write_text("{}")
    earlier = f"{study_dir(tmp_path)} already holds the runs 0 of an earlier sweep"
    with pytest.raises(FileExistsError, match=f"^{re.escape(earlier)}"):
        sweep_here(tmp_path, "hydra.sweeper.n_trials=1")
    assert (old_run / "result.json").read_text() == "{}"


def test_a_bad_sweeper_setting_is_refused_on_the_command_line_before_any_trial(
    tmp_path: Path, data_dir: Path
):
    result = optuna_sweep("mode=up", log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode != 0
    assert "mode=up is not valid; choose max or min" in result.stderr
    assert not study_dir(tmp_path).exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
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
def test_bad_sweeper_settings_are_refused_before_any_trial(tmp_path: Path, override: str, message: str):
    with pytest.raises((InstantiationException, ValueError), match=re.escape(message)):
        sweep_here(tmp_path, override)
    assert not any(tmp_path.iterdir())
