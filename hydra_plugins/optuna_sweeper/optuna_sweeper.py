"""A Hydra sweeper that runs an Optuna study through current Optuna's ask-and-tell interface.

Why not the published hydra-optuna-sweeper: its newest release (1.3.0) requires optuna<3, whose SQLite
storage fails under SQLAlchemy 2, and one failed trial ends its whole sweep. This one is small and does:

- the search space in the override grammar Hydra users know (`choice`, `range`, `interval`, `tag(log, ...)`);
- a persistent study (SQLite in the sweep dir by default, a journal file on a shared file system, or a
  database server): rerunning the same command continues it until `n_trials` trials have finished
  (completed or pruned), and refuses to mix in a different search space;
- one study, many launches: the same command started on several machines (or several times on one) shares
  the work. Each launch takes trials only while finished + running ones are fewer than `n_trials` (under a
  study-wide lock, so together they run exactly `n_trials`), and keeps a heartbeat on its running trials; a
  trial whose heartbeat stops (its launch was killed) is failed by the others after `grace_period` seconds
  and run again up to `stale_retries` times;
- failure tolerance: a trial that raises is told to Optuna as failed with its error, and the sweep goes on
  until more than `max_failure_rate * n_trials` trials of this launch have failed;
- trial N runs as Hydra job N (`<sweep dir>/<N>`), so a job finds its own trial: `current_trial()`.

Optuna does all the searching and pruning; this module only translates between it and Hydra.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep, Transformer
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, RunMode, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig

from hydra_plugins.sweep_summary.callback import describe_error, job_error

if TYPE_CHECKING:  # optuna is imported where it is used: every Hydra start imports this module
    import optuna
    from optuna.distributions import BaseDistribution

log = logging.getLogger(__name__)

# The run's `mode` (configs/train.yaml) in Optuna's words.
DIRECTIONS = {"max": "maximize", "min": "minimize"}
# A storage that is not a database URL is a journal file, named so that a typo of a URL is not taken for one.
JOURNAL_SUFFIXES = (".journal", ".log")
HEARTBEAT = "heartbeat"  # the trial system attribute a launch rewrites while it runs the trial


class SearchSpace:
    """Optuna distributions for the swept keys, and the override text of a sampled value."""

    def __init__(self) -> None:
        self.distributions: dict[str, BaseDistribution] = {}
        self._choice_texts: dict[str, tuple[list[Any], list[str]]] = {}

    def add(self, key: str, sweep: ChoiceSweep | RangeSweep | IntervalSweep) -> None:
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if isinstance(sweep, ChoiceSweep):
            # Lists and dicts are not Optuna categories: they become their override text.
            values = [Transformer.encode(choice) for choice in sweep.list]
            self._choice_texts[key] = (values, [Transformer.str(choice) for choice in sweep.list])
            self.distributions[key] = CategoricalDistribution(values)
        elif isinstance(sweep, RangeSweep):
            values = list(sweep.range())
            if not values:
                raise ValueError(f"{key}: range({sweep.start}, {sweep.stop}, {sweep.step}) is empty")
            if "log" in sweep.tags:
                raise ValueError(
                    f"{key}: a range has a fixed step and cannot be log; use tag(log, interval(a, b))"
                )
            low, high = min(values), max(values)
            if all(isinstance(v, int) for v in (sweep.start, sweep.stop, sweep.step)):
                self.distributions[key] = IntDistribution(low, high, step=abs(sweep.step))
            else:
                self.distributions[key] = FloatDistribution(low, high, step=abs(float(sweep.step)))
        elif isinstance(sweep, IntervalSweep):
            log_scale = "log" in sweep.tags
            if log_scale and sweep.start <= 0:
                raise ValueError(f"{key}: a log interval needs a positive lower bound, got {sweep.start}")
            if "int" in sweep.tags:
                self.distributions[key] = IntDistribution(int(sweep.start), int(sweep.end), log=log_scale)
            else:
                self.distributions[key] = FloatDistribution(sweep.start, sweep.end, log=log_scale)
        else:
            raise ValueError(f"{key}: {sweep} is not a choice, range or interval")

    def override(self, key: str, value: Any) -> str:
        """`key=value` in Hydra's override grammar, for a value sampled from this key's distribution."""
        if key in self._choice_texts:
            values, texts = self._choice_texts[key]
            return f"{key}={texts[values.index(value)]}"
        return f"{key}={Transformer.str(value)}"

    def describe(self) -> dict[str, str]:
        """The distributions as text: stored with the study, compared when it is continued."""
        return {key: repr(dist) for key, dist in sorted(self.distributions.items())}


def parse_search(params: DictConfig | None, arguments: Sequence[str]) -> tuple[SearchSpace, list[str]]:
    """The search space from `params` and sweep overrides on the command line; the fixed overrides.

    A sweep on the command line (`data.batch_size=32,64`) becomes a dimension of the search; a plain
    value (`trainer.max_epochs=3`) is fixed for every trial and replaces a search over the same key.
    """
    parser = OverridesParser.create()
    swept: dict[str, Any] = {}
    for key, value in (params or {}).items():
        swept[key] = parser.parse_override(f"{key}={value}")
    fixed: list[str] = []
    for override in parser.parse_overrides(list(arguments)):
        key = override.get_key_element()
        swept.pop(override.key_or_group, None)
        if override.is_sweep_override():
            swept[key] = override
        else:
            fixed.append(override.input_line)
    space = SearchSpace()
    for key, override in swept.items():
        if override.is_sweep_override():
            space.add(key, override.value())
        else:  # a plain value in `params` is fixed, like one on the command line
            fixed.append(f"{key}={override.get_value_element_as_str()}")
    return space, fixed


class OptunaSweeper(Sweeper):
    """Hydra sweeper: ask Optuna for trials, launch each as a Hydra job, tell Optuna what it returned."""

    def __init__(
        self,
        study_name: str,
        storage: str,
        mode: str,
        n_trials: int,
        n_jobs: int,
        max_failure_rate: float,
        heartbeat_interval: float,
        grace_period: float,
        stale_retries: int,
        sampler: DictConfig | None,
        pruner: DictConfig | None,
        params: DictConfig | None,
    ) -> None:
        """The keys of configs/hydra/sweeper/optuna.yaml (`_recursive_: false`: sampler and pruner stay configs).

        `mode` is checked when the sweep starts, where the error can name the key it came from.
        """
        if n_trials < 1 or n_jobs < 1:
            raise ValueError(f"hydra.sweeper.n_trials={n_trials} and n_jobs={n_jobs} must both be at least 1")
        if not 0.0 <= max_failure_rate <= 1.0:
            raise ValueError(f"hydra.sweeper.max_failure_rate={max_failure_rate} must be between 0 and 1")
        if not storage:
            raise ValueError(
                "hydra.sweeper.storage is empty; the study needs a database that every trial can reach, "
                "e.g. sqlite:///<dir>/optuna.db (the default) or a server URL"
            )
        if not 0 < heartbeat_interval < grace_period:
            raise ValueError(
                f"hydra.sweeper.heartbeat_interval={heartbeat_interval} and grace_period={grace_period}: "
                "give 0 < heartbeat_interval < grace_period (a trial is stale after grace_period seconds "
                "without a heartbeat; several beats should fit in it)"
            )
        if stale_retries < 0:
            raise ValueError(f"hydra.sweeper.stale_retries={stale_retries} must be 0 or more")
        self.study_name = study_name
        self.storage = storage
        self.mode = mode
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.max_failure_rate = max_failure_rate
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self.stale_retries = stale_retries
        self.sampler = sampler
        self.pruner = pruner
        self.params = params
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> None:
        from optuna.trial import TrialState

        if self.mode not in DIRECTIONS:
            # hydra.sweeper.mode follows the run's top-level `mode`: name that key, unless it was set apart.
            key = "mode" if self.config.get("mode") == self.mode else "hydra.sweeper.mode"
            raise ValueError(f"{key}={self.mode} is not valid; choose max or min")
        space, fixed = parse_search(self.params, arguments)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        lock = StudyLock(self.storage, self.study_name)
        with lock:  # also creating the database's tables: launches started at once would race at it
            storage = open_storage(self.storage)  # kept: the heartbeat writes to it
            study = self._load_study(storage, space, fixed, sweep_dir)
        finished = _count(study, TrialState.COMPLETE, TrialState.PRUNED)
        if finished >= self.n_trials:
            log.info(
                f"Study {self.study_name} already has {finished} finished trials (hydra.sweeper.n_trials="
                f"{self.n_trials}); raise n_trials to run more, or name a new study"
            )
            return
        log.info(
            f"Study {self.study_name} ({self.storage}): {finished} of {self.n_trials} trials finished; "
            f"searching {', '.join(space.distributions) or 'nothing'}"
        )
        max_failures = math.floor(self.max_failure_rate * self.n_trials)
        failures, last_failure, waiting = 0, -1, False
        with Heartbeat(
            study, storage, lock, self.heartbeat_interval, self.grace_period, self.stale_retries
        ) as heart:
            while True:
                with lock:  # count and ask as one step: launches running at once never take too many trials
                    heart.fail_stale_trials()
                    finished = _count(study, TrialState.COMPLETE, TrialState.PRUNED)
                    running = _count(study, TrialState.RUNNING)
                    free = min(self.n_jobs, self.n_trials - finished - running)
                    trials = [study.ask(space.distributions) for _ in range(max(free, 0))]
                    heart.start_beating(trials)
                if finished >= self.n_trials:
                    break
                if not trials:  # the study's last trials run in other launches: wait for them to end
                    if not waiting:
                        log.info(
                            f"Waiting for {running} trials running in other launches; if one stops beating "
                            f"for {self.grace_period:g} s, it is run again here"
                        )
                    waiting = True
                    time.sleep(self.heartbeat_interval)
                    continue
                waiting = False
                overrides = [
                    fixed + [space.override(k, v) for k, v in trial.params.items()] for trial in trials
                ]
                for trial, trial_overrides in zip(trials, overrides, strict=True):
                    trial.set_user_attr("overrides", trial_overrides)  # to rerun any trial by hand
                for trial, state in zip(trials, self._run(study, trials, overrides, lock), strict=True):
                    heart.stop_beating(trial)
                    if state is None:  # failed meanwhile by another launch, which runs it again
                        continue
                    if state == TrialState.FAIL:
                        failures, last_failure = failures + 1, trial.number
                    log.info(f"Trial {trial.number} {state.name.lower()}: {_outcome(study, trial.number)}")
                if failures > max_failures:
                    raise RuntimeError(
                        f"{failures} trials of study {self.study_name} failed in this sweep, more than "
                        f"hydra.sweeper.max_failure_rate={self.max_failure_rate} of n_trials={self.n_trials} "
                        f"allows; last error: {_outcome(study, last_failure, failed_only=True)}. The "
                        f"summary is in {sweep_dir}; rerunning the same command continues the study"
                    )
        self._report_best(study)

    def _load_study(
        self, storage: optuna.storages.BaseStorage, space: SearchSpace, fixed: list[str], sweep_dir: Path
    ) -> optuna.Study:
        """Create the study, or continue it if it exists with the same search space and direction."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # this sweeper logs each trial itself
        sweep_dir.mkdir(parents=True, exist_ok=True)
        previous = _existing_study(storage, self.study_name)
        launch = (
            previous.user_attrs.get("launches", 1) if previous else 0
        )  # how many launched before this one
        if previous is None:
            _refuse_runs_of_another_study(sweep_dir, self.study_name)
        else:
            self._check_continuation(previous, space, fixed)
        study = optuna.create_study(
            study_name=self.study_name,
            storage=storage,
            sampler=_sampler(self.sampler, launch=launch),
            pruner=instantiate(self.pruner) if self.pruner else optuna.pruners.NopPruner(),
            direction=DIRECTIONS[self.mode],
            load_if_exists=True,
        )
        if previous is None:
            study.set_user_attr("search_space", space.describe())
            study.set_user_attr("fixed_overrides", sorted(fixed))
        study.set_user_attr("launches", launch + 1)
        return study

    def _check_continuation(self, previous: optuna.Study, space: SearchSpace, fixed: list[str]) -> None:
        """Refuse to continue a study with another direction or search space; warn about other overrides."""
        direction = previous.direction.name.lower()  # maximize or minimize
        searched_before: dict[str, str] = previous.user_attrs.get("search_space", {})
        changed = [
            f"{key}: {searched_before.get(key, 'not searched')} -> {now}"
            for key, now in space.describe().items()
            if searched_before.get(key) != now
        ]
        changed += [f"{key}: no longer searched" for key in searched_before if key not in space.distributions]
        if direction != DIRECTIONS[self.mode]:
            changed.insert(0, f"direction: {direction} -> {DIRECTIONS[self.mode]} (mode={self.mode})")
        if changed:
            raise ValueError(
                f"study {self.study_name} in {self.storage} was started with another setup "
                f"({'; '.join(changed)}); continue it with the same search, or start a new study: "
                "hydra.sweeper.study_name=<new name>"
            )
        fixed_before = set(previous.user_attrs.get("fixed_overrides", []))
        if fixed_before != set(fixed):
            log.warning(
                f"Study {self.study_name} continues with other fixed overrides (dropped: "
                f"{sorted(fixed_before - set(fixed)) or 'none'}, added: {sorted(set(fixed) - fixed_before) or 'none'}); "
                "its new trials may not compare with the earlier ones"
            )

    def _run(
        self, study: optuna.Study, trials: list[optuna.Trial], overrides: list[list[str]], lock: StudyLock
    ) -> list[Any]:
        """Launch the trials as Hydra jobs numbered like the trials; tell Optuna how each ended."""
        from optuna.trial import TrialState

        states: dict[int, TrialState] = {}
        runnable = []
        for trial, trial_overrides in zip(trials, overrides, strict=True):
            try:  # a combination that does not compose fails only its own trial
                self.validate_batch_is_legal([trial_overrides])
                runnable.append((trial, trial_overrides))
            except Exception as err:
                states[trial.number] = tell(study, trial, err, lock)
        # Job number = trial number: a job finds its trial by it. One launch per run of consecutive numbers.
        for group in _consecutive(runnable):
            first = group[0][0].number
            try:
                returns = self.launcher.launch([o for _, o in group], initial_job_idx=first)
            except Exception as err:  # the launcher itself failed (e.g. a cluster job was killed)
                for trial, _ in group:
                    states[trial.number] = tell(study, trial, err, lock)
                continue
            for (trial, _), job_return in zip(group, returns, strict=True):
                states[trial.number] = tell(study, trial, result_of(job_return), lock)
        return [states[trial.number] for trial in trials]

    def _report_best(self, study: optuna.Study) -> None:
        try:
            best = study.best_trial
        except ValueError:
            log.warning(f"Study {self.study_name} has no completed trial")
            return
        command = " ".join(best.user_attrs.get("overrides", []))
        log.info(f"Best trial {best.number}: {best.value:.6g}; rerun it with: python src/train.py {command}")


def current_trial() -> optuna.Trial | None:
    """This job's Optuna trial when it runs under `OptunaSweeper`, else None (a plain run or another sweeper).

    The sweeper launches trial N as job N, so the job's number names its trial; the study and the pruner
    come from the job's own copy of the sweeper config.
    """
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN or hydra_cfg.sweeper.get("_target_") != _TARGET:
        return None
    import optuna

    sweeper = hydra_cfg.sweeper
    storage = open_storage(sweeper.storage)
    pruner = instantiate(sweeper.pruner) if sweeper.pruner else optuna.pruners.NopPruner()
    study = optuna.load_study(
        study_name=sweeper.study_name, storage=storage, pruner=pruner, sampler=optuna.samplers.RandomSampler()
    )
    study_id = storage.get_study_id_from_name(sweeper.study_name)
    return optuna.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, hydra_cfg.job.num))


_TARGET = f"{OptunaSweeper.__module__}.{OptunaSweeper.__qualname__}"


def result_of(job_return: JobReturn) -> float | BaseException:
    """What a trial's job gives the study: its finite optimized_metric, or the error that ended it (Optuna's
    TrialPruned when it was pruned)."""
    if job_return.status != JobStatus.COMPLETED:
        return job_error(job_return)
    value = job_return.return_value
    if not isinstance(value, int | float) or not math.isfinite(value):
        return ValueError(f"the task returned {value!r}, not a finite optimized_metric")
    return float(value)


def tell(study: optuna.Study, trial: optuna.Trial, result: float | BaseException, lock: StudyLock) -> Any:
    """Tell the study how this launch's trial ended; return its state, or None when another launch failed it
    meanwhile (see `_failed_meanwhile`).

    Under the study lock, under which another launch fails a stale trial: Optuna checks that a trial still
    runs and then updates it, and on SQLite (no row locks) a failure written between the two was overwritten
    by the result, so the study counted the trial and its rerun both (n_trials + 1 completed).
    """
    import optuna
    from optuna.trial import TrialState

    with lock:
        if _failed_meanwhile(study, trial):
            return None
        if isinstance(result, optuna.TrialPruned):
            study.tell(trial, state=TrialState.PRUNED)
            return TrialState.PRUNED
        if isinstance(result, BaseException):
            trial.set_user_attr("error", describe_error(result))
            study.tell(trial, state=TrialState.FAIL)
            return TrialState.FAIL
        study.tell(trial, result)
        return TrialState.COMPLETE


def _outcome(study: optuna.Study, number: int, failed_only: bool = False) -> str:
    frozen = study.get_trials(deepcopy=False)[number]
    if failed_only or frozen.value is None:
        return frozen.user_attrs.get("error", "no value")
    params = ", ".join(f"{k}={v}" for k, v in frozen.params.items())
    return f"{frozen.value:.6g} with {params}"


def _failed_meanwhile(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether another launch failed this trial as stale while it ran here (this launch stopped beating for
    longer than grace_period, e.g. it was suspended): its result is dropped, since a rerun took its place, and
    it is neither this launch's failure nor its success (`tell` returns None for it)."""
    from optuna.trial import TrialState

    state = study.get_trials(deepcopy=False)[trial.number].state
    if state == TrialState.RUNNING:
        return False
    log.warning(
        f"Trial {trial.number} was failed by another launch while it ran here (no heartbeat for longer than "
        "hydra.sweeper.grace_period); its result is not told to the study"
    )
    return True


def _process_exists(pid: Any) -> bool:
    if not isinstance(pid, int):
        return True  # unknown: leave it to the heartbeat's timeout
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def open_storage(storage: str) -> optuna.storages.BaseStorage:
    """The study's storage: a database URL (sqlite:///..., postgresql://..., mysql://...) or a journal file."""
    import optuna

    _local_file(storage)  # refuses what is neither, and makes the folder of a file
    if "://" not in storage:
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage))
    # Quiet the database layer: alembic logs every plugin it loads at INFO.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        return optuna.storages.RDBStorage(storage)
    except ModuleNotFoundError as err:  # the database's driver
        extra = ' (pip install -e ".[postgres]")' if storage.startswith("postgresql") else ""
        raise ModuleNotFoundError(
            f"hydra.sweeper.storage={storage} needs the Python package {err.name}{extra}"
        ) from err


def _local_file(storage: str) -> Path | None:
    """The file the storage lives in, with its folder made: a journal file or an SQLite database; None for a
    database server (or SQLite in memory). A storage that is neither a URL nor a journal file is refused."""
    if "://" in storage:
        from sqlalchemy.engine import make_url

        url = make_url(storage)
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return None
        path = Path(url.database)
    elif storage.endswith(JOURNAL_SUFFIXES):
        path = Path(storage)
    else:
        raise ValueError(
            f"hydra.sweeper.storage={storage} is neither a database URL (sqlite:///<file>.db, "
            f"postgresql://<user>@<host>/<database>, mysql://...) nor a journal file ({' or '.join(JOURNAL_SUFFIXES)})"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class StudyLock:
    """Held while a launch counts the study's trials and asks for new ones (so that launches running at once
    never take more than n_trials together), fails stale trials, or tells a result; reentered for each step.
    The system releases it when its holder dies: SQLite, a lock on the file `<database>.lock`; PostgreSQL and
    MySQL, an advisory lock of the connection. A journal file's lock is a file that is broken 30 s after its holder died (Optuna's lock for
    shared file systems)."""

    def __init__(self, url: str, study_name: str) -> None:
        import optuna
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url
        from sqlalchemy.pool import NullPool

        self._threads = threading.Lock()  # the launch's own threads (its heartbeat's) take turns first
        self._journal = self._file = self._engine = None
        self._name = study_name
        local = _local_file(url)
        if "://" not in url:
            self._journal = optuna.storages.journal.JournalFileOpenLock(f"{url}.sweeper")
        elif make_url(url).get_backend_name() == "sqlite":
            if local is not None:
                self._file = open(f"{local}.lock", "a")  # noqa: SIM115 - open as long as the sweep
        else:
            self._engine = create_engine(url, poolclass=NullPool)  # a connection of its own, for the lock
            self._dialect = make_url(url).get_backend_name()
            if self._dialect not in ("postgresql", "mysql"):
                log.warning(
                    f"No lock for a {self._dialect} storage: launches of one study that ask for trials at "
                    "the same moment may run a few more than n_trials"
                )
                self._engine = None
        self._connection = None

    def __enter__(self) -> None:
        self._threads.acquire()
        try:
            self._acquire()
        except BaseException:
            self._threads.release()
            raise

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self._release()
        finally:
            self._threads.release()

    def _acquire(self) -> None:
        from sqlalchemy import text

        if self._journal is not None:
            self._journal.acquire()
        elif self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_EX)
        elif self._engine is not None:
            self._connection = self._engine.connect()
            if self._dialect == "postgresql":
                self._connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": self._key()})
            else:
                self._connection.execute(text("SELECT GET_LOCK(:name, -1)"), {"name": self._key()})

    def _release(self) -> None:
        from sqlalchemy import text

        if self._journal is not None:
            self._journal.release()
        elif self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
        elif self._connection is not None:
            try:
                if self._dialect == "postgresql":
                    self._connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self._key()})
                else:
                    self._connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": self._key()})
                self._connection.commit()
            finally:
                self._connection.close()
                self._connection = None

    def _key(self) -> int:
        """The study's advisory lock number: the same in every launch, apart from other studies'."""
        digest = hashlib.sha256(f"optuna study {self._name}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)


class Heartbeat:
    """A launch's thread that rewrites a heartbeat on each of its running trials every `interval` seconds,
    and fails the study's other running trials whose heartbeat has not changed for `grace_period` seconds
    (their launch died), enqueuing each again up to `retries` times.

    A heartbeat is judged by whether it changes, timed on the watching launch's own clock, so machines whose
    clocks disagree still judge right. A trial of a launch on the same machine whose process has ended is
    failed at once (a sweep killed and started again needs no wait)."""

    def __init__(
        self,
        study: optuna.Study,
        storage: optuna.storages.BaseStorage,
        lock: StudyLock,
        interval: float,
        grace_period: float,
        retries: int,
    ) -> None:
        self.study, self.storage, self.lock = study, storage, lock  # the storage the study was opened with
        self.interval, self.grace_period, self.retries = interval, grace_period, retries
        self._study_id = storage.get_study_id_from_name(study.study_name)
        self._mine: dict[int, int] = {}  # trial number -> id, of the trials this launch runs
        self._seen: dict[int, tuple[Any, float]] = {}  # trial number -> (its last heartbeat, when it changed)
        self.host = socket.gethostname()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="optuna-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()

    def start_beating(self, trials: list[optuna.Trial]) -> None:
        ids = {trial.number: self._trial_id(trial.number) for trial in trials}
        with self._guard:
            self._mine |= ids
        self._beat(list(ids.values()))

    def stop_beating(self, trial: optuna.Trial) -> None:
        with self._guard:
            self._mine.pop(trial.number, None)

    def _trial_id(self, number: int) -> int:
        """The storage's id of the study's trial `number` (the storage's methods take ids, which Optuna's
        trial objects keep private)."""
        return self.storage.get_trial_id_from_study_id_trial_number(self._study_id, number)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._guard:
                mine = list(self._mine.values())
            try:
                self._beat(mine)
                if self._stale():
                    with self.lock:
                        self.fail_stale_trials()
            except Exception as err:  # a database hiccup must not end the sweep: the next beat tries again
                log.warning(f"Heartbeat of study {self.study.study_name} failed: {describe_error(err)}")

    def _beat(self, trial_ids: list[int]) -> None:
        beat = {"time": time.time(), "host": self.host, "pid": os.getpid()}
        for trial_id in trial_ids:
            self.storage.set_trial_system_attr(trial_id, HEARTBEAT, beat)

    def _stale(self) -> list[tuple[Any, str]]:
        """The study's running trials, other than this launch's, whose launch is gone, each with why: a
        launch on this machine whose process ended, or a heartbeat that stood still for grace_period."""
        from optuna.trial import TrialState

        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        now, stale = time.monotonic(), []
        with self._guard:
            for trial in running:
                if trial.number in self._mine:
                    continue
                beat = trial.system_attrs.get(HEARTBEAT) or {}
                last, since = self._seen.get(trial.number, (None, now))
                if beat.get("host") == self.host and not _process_exists(beat.get("pid")):
                    stale.append((trial, f"interrupted: its launch (process {beat.get('pid')}) ended"))
                elif trial.number not in self._seen or beat != last:
                    self._seen[trial.number] = (beat, now)
                elif now - since > self.grace_period:
                    host = beat.get("host", "an unknown machine")
                    stale.append(
                        (trial, f"stale: no heartbeat from its launch on {host} for {self.grace_period:g} s")
                    )
        return stale

    def fail_stale_trials(self) -> None:
        """Fail the stale trials (call it holding the study lock, so that one launch fails each) and enqueue
        their parameters again while retries are left."""
        import optuna
        from optuna.trial import TrialState

        for trial, why in self._stale():
            trial_id = self._trial_id(trial.number)
            try:
                self.storage.set_trial_user_attr(trial_id, "error", why)
                if not self.storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # it ended meanwhile
            retries = trial.user_attrs.get("retries", 0)
            again = retries < self.retries
            if again:
                self.study.enqueue_trial(
                    trial.params, user_attrs={"retry_of": trial.number, "retries": retries + 1}
                )
            log.warning(
                f"Trial {trial.number} {why.partition(': ')[2]}; marked failed"
                + (", enqueued again" if again else f" (hydra.sweeper.stale_retries={self.retries} used up)")
            )


def _existing_study(storage: Any, study_name: str) -> optuna.Study | None:
    import optuna

    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return None


def _sampler(config: DictConfig | None, launch: int) -> optuna.samplers.BaseSampler | None:
    """The configured sampler, its seed + the number of launches of the study before this one: launches at
    once, or a study continued later, do not replay each other's random draws (the same seed would propose
    the same trials again); the first launch draws as the seed says."""
    if not config:
        return None
    if config.get("seed") is not None and launch:
        return instantiate(config, seed=config.seed + launch)
    return instantiate(config)


def _count(study: optuna.Study, *states: Any) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def _consecutive(items: list[tuple[Any, list[str]]]) -> list[list[tuple[Any, list[str]]]]:
    """Split (trial, overrides) pairs into runs of consecutive trial numbers."""
    groups: list[list[tuple[Any, list[str]]]] = []
    for item in items:
        if groups and item[0].number == groups[-1][-1][0].number + 1:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _refuse_runs_of_another_study(sweep_dir: Path, study_name: str) -> None:
    """A new study must not write its trial 0, 1, ... over job dirs that are already there."""
    jobs = sorted(p.name for p in sweep_dir.iterdir() if (p / ".hydra").is_dir())
    if jobs:
        raise FileExistsError(
            f"{sweep_dir} already holds the runs {', '.join(jobs)} of an earlier sweep, but its study "
            f"{study_name} is not in the storage; move them away, or name a new study: "
            "hydra.sweeper.study_name=<new name>"
        )
