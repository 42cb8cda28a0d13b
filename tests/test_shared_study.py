"""One Optuna study, many launches: the same `python src/train.py -m hparams_search=<name>` started several
times at once, on one machine or on many, shares the study. Together the launches finish exactly n_trials,
none fails another's trial, and a trial whose launch died is failed and run again by a survivor."""

import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.optuna_sweeper.optuna_sweeper import HEARTBEAT, Heartbeat, StudyLock, open_storage, tell
from tests.conftest import free_port, start_cli

# Short trials, and heartbeats every half second (a launch waiting for others' trials looks that often).
SEARCH = ["-m", "hparams_search=digits_mlp", "trainer.max_epochs=1", "hydra.sweeper.heartbeat_interval=0.5"]


class Launch:
    """`python src/train.py -m hparams_search=digits_mlp ...` started in the background."""

    def __init__(
        self, name: str, storage: str, n_trials: int, log_dir: Path, data_dir: Path, *overrides: str
    ) -> None:
        overrides = (
            *SEARCH,
            f"hydra.sweeper.n_trials={n_trials}",
            f"hydra.sweeper.storage={storage}",
            *overrides,
        )
        self.log = log_dir / f"{name}.out"
        self.process = start_cli("train", *overrides, log_dir=log_dir, data_dir=data_dir, output=self.log)

    def output(self) -> str:
        return self.log.read_text() + Path(f"{self.log}.err").read_text()

    def wait(self, timeout: float = 240) -> str:
        """Wait for the launch to end successfully; return its output."""
        returncode = self.process.wait(timeout)
        assert returncode == 0, self.output()[-3000:]
        return self.output()

    def signal(self, number: signal.Signals) -> None:
        os.kill(self.process.pid, number)


def study_of(storage: str, locked: bool = True) -> optuna.Study:
    # Under the launches' lock: a launch creates the database's tables under it, and opening the storage
    # while it does would race at creating them ("table ... already exists"). Unlocked once they exist.
    if not locked:
        return optuna.load_study(study_name="digits_mlp", storage=open_storage(storage))
    with StudyLock(storage, "digits_mlp"):
        opened = open_storage(storage)
    return optuna.load_study(study_name="digits_mlp", storage=opened)


def running_trial_of(launch: Launch, storage: str, log_dir: Path, timeout: float = 120) -> int:
    """The number of a trial `launch` runs, once its job has started."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert launch.process.poll() is None, launch.output()[-3000:]
        try:
            trials = study_of(storage).get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        except KeyError:  # the study is not created yet
            trials = []
        for trial in trials:
            beat = trial.system_attrs.get("heartbeat", {})
            job_dir = log_dir / "train" / "studies" / "digits_mlp" / str(trial.number)
            if beat.get("pid") == launch.process.pid and (job_dir / ".hydra").is_dir():
                return trial.number
        time.sleep(0.1)
    raise AssertionError(f"{launch.log.stem} ran no trial in {timeout} s: {launch.output()[-3000:]}")


def stop_in_a_trial(launch: Launch, storage: str, log_dir: Path) -> int:
    """SIGSTOP `launch` while it runs a trial; return that trial's number.

    A trial of this search takes about a second: the one seen running may have ended before the signal, so
    the launch is stopped first and the trial looked at again (resumed and retried when it had ended),
    without the launches' lock, which the stopped launch may hold.
    """
    while True:
        number = running_trial_of(launch, storage, log_dir)
        launch.signal(signal.SIGSTOP)
        if study_of(storage, locked=False).trials[number].state == TrialState.RUNNING:
            return number
        launch.signal(signal.SIGCONT)


def assert_team_finished(
    storage: str, n_trials: int, launches: list[Launch], died_in: int | None = None
) -> list[optuna.trial.FrozenTrial]:
    """Exactly n_trials completed, each launch ran some, no two ran the same values, and no trial failed but
    the one a launch died in (`died_in`), which ran again; return the trials."""
    trials = study_of(storage).trials
    states = [trial.state for trial in trials]
    assert states.count(TrialState.COMPLETE) == n_trials and TrialState.RUNNING not in states, states
    assert [t.number for t in trials if t.state == TrialState.FAIL] == ([] if died_in is None else [died_in])
    pids = {trial.system_attrs["heartbeat"]["pid"] for trial in trials}
    assert pids == {launch.process.pid for launch in launches}, "a launch ran no trial"
    assert len({str(trial.params) for trial in trials}) == n_trials, "two launches ran the same values"
    if died_in is not None:
        (rerun,) = [t for t in trials if t.user_attrs.get("retry_of") == died_in]
        assert rerun.state == TrialState.COMPLETE and rerun.params == trials[died_in].params
    return trials


# Two launches at once on each storage: on SQLite one is killed, on a journal file one freezes, and on a
# PostgreSQL server (at the end) both finish.
@pytest.mark.slow
def test_a_killed_launch_has_its_trial_failed_and_run_again_by_the_other(tmp_path: Path, data_dir: Path):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    doomed, survivor = (Launch(name, storage, 3, tmp_path, data_dir) for name in ("doomed", "survivor"))
    cut_off = stop_in_a_trial(doomed, storage, tmp_path)
    doomed.signal(signal.SIGKILL)
    doomed.process.wait(10)
    output = survivor.wait()

    trials = assert_team_finished(storage, 3, [doomed, survivor], died_in=cut_off)
    # A launch on the same machine whose process is gone: no need to wait for the heartbeat's timeout.
    ended = f"its launch (process {doomed.process.pid}) ended"
    assert trials[cut_off].user_attrs["error"] == f"interrupted: {ended}"
    assert f"Trial {cut_off} {ended}; marked failed" in output


@pytest.mark.slow
def test_a_frozen_launch_has_its_trial_failed_after_the_heartbeat_timeout(tmp_path: Path, data_dir: Path):
    # SIGSTOP: the process exists but beats no more, as a machine that hangs or loses its network.
    storage = f"{tmp_path}/optuna.journal"
    # A heartbeat timeout of seconds instead of minutes; the other tests keep the default, so that a launch
    # the busy CI machine starves of CPU for a few seconds is not taken for a dead one.
    frozen, survivor = (
        Launch(name, storage, 3, tmp_path, data_dir, "hydra.sweeper.grace_period=3")
        for name in ("frozen", "survivor")
    )
    cut_off = stop_in_a_trial(frozen, storage, tmp_path)
    stopped_at = time.time()
    survivor.wait()

    trials = assert_team_finished(storage, 3, [frozen, survivor], died_in=cut_off)
    stale = f"stale: no heartbeat from its launch on {os.uname().nodename} for 3 s"
    assert trials[cut_off].user_attrs["error"] == stale
    assert time.time() - stopped_at > 3  # not before the timeout

    # Woken up, the frozen launch finishes its trial, keeps the study as it is, and ends.
    frozen.signal(signal.SIGCONT)
    output = frozen.wait()
    assert f"Trial {cut_off} was failed by another launch while it ran here" in output
    assert study_of(storage).trials[cut_off].state == TrialState.FAIL


def test_a_result_told_while_another_launch_fails_its_trial_as_stale_is_dropped(tmp_path: Path):
    # Optuna checks that a trial still runs, then updates it; on SQLite (no row locks) a failure written
    # between the two was overwritten by the result, and the study counted the trial and its rerun both
    # (seen in CI: 4 of n_trials=3 completed). A result waits for the lock under which launches fail trials.
    storage = f"sqlite:///{tmp_path}/optuna.db"
    opened = open_storage(storage)
    study = optuna.create_study(study_name="digits_mlp", storage=opened)
    trial = study.ask()
    ended = subprocess.Popen(["true"])  # the trial's launch, a process that has ended
    ended.wait()
    trial_id = opened.get_trial_id_from_study_id_trial_number(opened.get_study_id_from_name("digits_mlp"), 0)
    opened.set_trial_system_attr(trial_id, HEARTBEAT, {"host": socket.gethostname(), "pid": ended.pid})
    its_launch, other_launch = StudyLock(storage, "digits_mlp"), StudyLock(storage, "digits_mlp")
    heart = Heartbeat(study, opened, other_launch, interval=1, grace_period=3, retries=1)

    with ThreadPoolExecutor(1) as pool, other_launch:
        told = pool.submit(tell, study, trial, 0.9, its_launch)
        time.sleep(1)
        assert not told.done(), "the result was told without the launches' lock"
        heart.fail_stale_trials()
    assert told.result() is None  # dropped: a rerun takes the trial's place
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.WAITING]


# --- PostgreSQL: a real server, started for the test in a temporary folder ---


def postgres_bin() -> Path | None:
    """The folder of PostgreSQL's server programs (Debian keeps them off PATH), or None."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent  # a link on PATH to where the other programs are
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return versions[-1].parent if versions else None


@pytest.fixture
def postgres_url(tmp_path: Path) -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free local port, its database `optuna`; stopped at the end."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL's server programs (initdb, pg_ctl) are not installed: "
            "`sudo apt-get install postgresql` (Debian/Ubuntu) to run this test; .ci/run installs them"
        )
    # PostgreSQL refuses to run as root: as root, the cluster runs as the `postgres` user its package made,
    # in a folder of its own outside tmp_path (which only root may enter).
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder = Path(tempfile.mkdtemp(prefix="postgres-", dir=tmp_path if not as_user else None))
    if as_user:
        shutil.chown(folder, "postgres")
    user = "postgres" if as_user else getpass.getuser()
    port = free_port()

    def run(*command: str) -> None:
        subprocess.run([*as_user, *command], check=True, capture_output=True, timeout=60)

    run(str(bin_dir / "initdb"), "-D", f"{folder}/data", "-A", "trust", "-U", user, "--no-sync")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    run(str(bin_dir / "pg_ctl"), "-D", f"{folder}/data", "-o", options, "-l", f"{folder}/log", "-w", "start")
    try:
        run(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user, "optuna")
        yield f"postgresql://{user}@127.0.0.1:{port}/optuna"
    finally:
        run(str(bin_dir / "pg_ctl"), "-D", f"{folder}/data", "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder)


@pytest.mark.slow
def test_two_launches_share_a_study_on_a_postgresql_server(postgres_url: str, tmp_path: Path, data_dir: Path):
    launches = [Launch(name, postgres_url, 3, tmp_path, data_dir) for name in ("first", "second")]
    for launch in launches:
        launch.wait()
    assert_team_finished(postgres_url, 3, launches)
