"""A Hydra sweeper that runs an Optuna study through current Optuna's ask-and-tell interface.

Why not the published hydra-optuna-sweeper: its newest release (1.3.0) requires optuna<3, whose SQLite
storage fails under SQLAlchemy 2, and one failed trial ends its whole sweep. This one is small and does:

- the search space in the override grammar Hydra users know (`choice`, `range`, `interval`, `tag(log, ...)`);
- a persistent study (SQLite in the sweep dir by default): rerunning the same command continues it until
  `n_trials` trials have finished (completed or pruned), and refuses to mix in a different search space;
- failure tolerance: a trial that raises is told to Optuna as failed with its error, and the sweep goes on
  until more than `max_failure_rate * n_trials` trials of this launch have failed;
- trial N runs as Hydra job N (`<sweep dir>/<N>`), so a job finds its own trial: `current_trial()`.

Optuna does all the searching and pruning; this module only translates between it and Hydra.
"""

from __future__ import annotations

import logging
import math
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

from hydra_plugins.sweep_summary import describe_error

if TYPE_CHECKING:  # optuna is imported where it is used: every Hydra start imports this module
    import optuna
    from optuna.distributions import BaseDistribution

log = logging.getLogger(__name__)

# The run's `mode` (configs/train.yaml) in Optuna's words.
DIRECTIONS = {"max": "maximize", "min": "minimize"}


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
        self.study_name = study_name
        self.storage = storage
        self.mode = mode
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.max_failure_rate = max_failure_rate
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
        study = self._load_study(space, fixed, sweep_dir)
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
        failures, last_failure = 0, -1
        while finished < self.n_trials:
            trials = [
                study.ask(space.distributions) for _ in range(min(self.n_jobs, self.n_trials - finished))
            ]
            overrides = [fixed + [space.override(k, v) for k, v in trial.params.items()] for trial in trials]
            for trial, trial_overrides in zip(trials, overrides, strict=True):
                trial.set_user_attr("overrides", trial_overrides)  # to rerun any trial by hand
            for trial, state in zip(trials, self._run(study, trials, overrides), strict=True):
                if state == TrialState.FAIL:
                    failures, last_failure = failures + 1, trial.number
                else:
                    finished += 1
                log.info(f"Trial {trial.number} {state.name.lower()}: {_outcome(study, trial.number)}")
            if failures > max_failures:
                raise RuntimeError(
                    f"{failures} trials of study {self.study_name} failed in this sweep, more than "
                    f"hydra.sweeper.max_failure_rate={self.max_failure_rate} of n_trials={self.n_trials} "
                    f"allows; last error: {_outcome(study, last_failure, failed_only=True)}. The "
                    f"summary is in {sweep_dir}; rerunning the same command continues the study"
                )
        self._report_best(study)

    def _load_study(self, space: SearchSpace, fixed: list[str], sweep_dir: Path) -> optuna.Study:
        """Create the study, or continue it if it exists with the same search space and direction."""
        import optuna

        # Quiet the database layer: alembic logs every plugin it loads at INFO.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # this sweeper logs each trial itself
        sweep_dir.mkdir(parents=True, exist_ok=True)
        storage = optuna.storages.get_storage(self.storage)
        previous = _existing_study(storage, self.study_name)
        if previous is None:
            _refuse_runs_of_another_study(sweep_dir, self.study_name)
        else:
            self._check_continuation(previous, space, fixed)
        study = optuna.create_study(
            study_name=self.study_name,
            storage=storage,
            sampler=_sampler(self.sampler, trials_so_far=len(previous.trials) if previous else 0),
            pruner=instantiate(self.pruner) if self.pruner else optuna.pruners.NopPruner(),
            direction=DIRECTIONS[self.mode],
            load_if_exists=True,
        )
        if previous is None:
            study.set_user_attr("search_space", space.describe())
            study.set_user_attr("fixed_overrides", sorted(fixed))
        else:
            _fail_interrupted_trials(study, storage)
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

    def _run(self, study: optuna.Study, trials: list[optuna.Trial], overrides: list[list[str]]) -> list[Any]:
        """Launch the trials as Hydra jobs numbered like the trials; tell Optuna how each ended."""
        from optuna.trial import TrialState

        states: dict[int, TrialState] = {}
        runnable = []
        for trial, trial_overrides in zip(trials, overrides, strict=True):
            try:  # a combination that does not compose fails only its own trial
                self.validate_batch_is_legal([trial_overrides])
                runnable.append((trial, trial_overrides))
            except Exception as err:
                states[trial.number] = _fail(study, trial, err)
        # Job number = trial number: a job finds its trial by it. One launch per run of consecutive numbers.
        for group in _consecutive(runnable):
            first = group[0][0].number
            try:
                returns = self.launcher.launch([o for _, o in group], initial_job_idx=first)
            except Exception as err:  # the launcher itself failed (e.g. a cluster job was killed)
                for trial, _ in group:
                    states[trial.number] = _fail(study, trial, err)
                continue
            for (trial, _), job_return in zip(group, returns, strict=True):
                states[trial.number] = _tell(study, trial, job_return)
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

    logging.getLogger("alembic").setLevel(logging.WARNING)
    sweeper = hydra_cfg.sweeper
    storage = optuna.storages.get_storage(sweeper.storage)
    pruner = instantiate(sweeper.pruner) if sweeper.pruner else optuna.pruners.NopPruner()
    study = optuna.load_study(
        study_name=sweeper.study_name, storage=storage, pruner=pruner, sampler=optuna.samplers.RandomSampler()
    )
    study_id = storage.get_study_id_from_name(sweeper.study_name)
    return optuna.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, hydra_cfg.job.num))


_TARGET = f"{OptunaSweeper.__module__}.{OptunaSweeper.__qualname__}"


def _tell(study: optuna.Study, trial: optuna.Trial, job_return: JobReturn) -> Any:
    import optuna
    from optuna.trial import TrialState

    if job_return.status != JobStatus.COMPLETED:
        error = job_return._return_value  # the exception the task raised (`return_value` re-raises it)
        if isinstance(error, optuna.TrialPruned):
            study.tell(trial, state=TrialState.PRUNED)
            return TrialState.PRUNED
        return _fail(study, trial, error)
    value = job_return.return_value
    if not isinstance(value, int | float) or not math.isfinite(value):
        return _fail(study, trial, ValueError(f"the task returned {value!r}, not a finite optimized_metric"))
    study.tell(trial, float(value))
    return TrialState.COMPLETE


def _fail(study: optuna.Study, trial: optuna.Trial, error: BaseException) -> Any:
    from optuna.trial import TrialState

    trial.set_user_attr("error", describe_error(error))
    study.tell(trial, state=TrialState.FAIL)
    return TrialState.FAIL


def _outcome(study: optuna.Study, number: int, failed_only: bool = False) -> str:
    frozen = study.get_trials(deepcopy=False)[number]
    if failed_only or frozen.value is None:
        return frozen.user_attrs.get("error", "no value")
    params = ", ".join(f"{k}={v}" for k, v in frozen.params.items())
    return f"{frozen.value:.6g} with {params}"


def _fail_interrupted_trials(study: optuna.Study, storage: Any) -> None:
    """Trials still running when a sweep starts were cut off by the end of an earlier sweep (a kill, a
    crash): mark them failed, so they neither count nor linger. One sweep per study at a time."""
    from optuna.trial import TrialState

    study_id = storage.get_study_id_from_name(study.study_name)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.set_trial_user_attr(trial_id, "error", "interrupted: its sweep ended while it ran")
        study.tell(trial.number, state=TrialState.FAIL)
        log.warning(f"Trial {trial.number} was interrupted by the end of an earlier sweep; marked failed")


def _existing_study(storage: Any, study_name: str) -> optuna.Study | None:
    import optuna

    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return None


def _sampler(config: DictConfig | None, trials_so_far: int) -> optuna.samplers.BaseSampler | None:
    """The configured sampler; a continued study gets seed + trials so far, so it does not replay the
    random draws of its first launch (a seeded sampler would otherwise propose the same trials again)."""
    if not config:
        return None
    if config.get("seed") is not None and trials_so_far:
        return instantiate(config, seed=config.seed + trials_so_far)
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
