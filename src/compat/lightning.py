"""Every use of Lightning's private names in this template; the rest of src/ uses its public API (the
template's own tests check that). Each use, why, the upstream issue, and what to do when a Lightning
release breaks it (the weekly CI job against the newest Lightning is there to notice):

- `_hydra_subprocess_cmd` and `_launch_process_observer`, functions of Lightning's subprocess launcher
  (`lightning.fabric.strategies.launchers.subprocess_script`, imported by name into the pytorch one): DDP
  under Hydra. The launcher restarts the script for each extra local rank with the original command line,
  which under `-m` runs the whole sweep again in every worker (src/launch/hydra_ddp.py says more).
  `replace_launcher_functions` puts the template's in both modules. Upstream: Lightning issue #11300 (the
  fix in PR #11617 handles a single run only), PR #18175 (open), Hydra issue #2070. When it breaks:
  `replace_launcher_functions` raises, naming this file; find the launcher's new hook in
  `subprocess_script.py`.
- `_ChildProcessObserver`, with its `_run`, `_terminate_all`, `_finished`, `_child_processes` and
  `_termination_signal`: `WorkerObserver`, Lightning's watcher of the DDP workers, which SIGKILLs the main
  process when a worker fails, made stoppable at a job's end and able to spare the main process when that
  is a sweeper (one failed trial killed the whole sweep). Upstream: part of the same launcher (#11300,
  #18175); no issue of its own. When it breaks: tests/test_ddp.py fails; rebuild `WorkerObserver` on the
  new observer.
- `_RefreshThread` (`lightning.pytorch.callbacks.progress.rich_progress`) and the rich `Live` display's
  `_refresh_thread` and `_lock`: `wake_refresh_thread` swaps the progress bar's refresh thread for one that
  ends as soon as it is stopped. Lightning's sleeps between redraws and `CustomProgress.stop` joins it, so
  the end of fit, and of test, waits up to 1/refresh_rate s each (Lightning PR #21321 made the thread sleep
  rather than wait on an event). When it breaks: `wake_refresh_thread` leaves a thread it does not know
  alone, and the bar only stops more slowly.
- `_every_n_train_steps` and `_train_time_interval` of `ModelCheckpoint`: src/run/builder.py lets
  Lightning skip the checkpoint's batch hook when it saves only at epoch ends (`saves_within_epochs`); its
  idle hooks cost the template benchmark's MLP case a few percent of a step. No
  upstream issue: the constructor's settings have no public accessor. When it breaks: the attribute error
  names them; read the new names in `model_checkpoint.py`.
- `_defer_save_until_validation` of `ModelCheckpoint`: a step save whose monitored metric is missing or
  about to be replaced (the epoch's last batch, before its validation) waits for the next validation, and
  Lightning 2.6 keeps that in this flag, outside the callback's `state_dict`. A run resumed from a checkpoint
  written while a save waited forgot it and saved its best checkpoint at another step than the run that
  never stopped (`src/callbacks/resume_state.py` saves and restores it: `deferred_save`,
  `set_deferred_save`). No upstream issue found. When it breaks: tests/test_resume.py's kill tests fail; read
  the new name in `model_checkpoint.py`.
- `setup_data` of the fit loop's validation loop (an `_EvaluationLoop`): `set_up_validation_data`. Before
  an epoch's last batch, `ModelCheckpoint` decides whether validation follows it from
  `trainer.num_val_batches`, which stays 0 until the validation loader was set up in this process. A run
  resumed mid-epoch runs no sanity check, so it saved a step's best checkpoint judged by the previous
  validation's score where the run that never stopped waited for the validation (with
  `check_val_every_n_epoch` above 1). No upstream issue found. When it breaks: the attribute error names
  it; tests/test_resume.py's kill tests check the result.
- `_average_model` and `_latest_update_step` of `WeightAveraging`: the moving-average callback makes the
  update of the step a checkpoint is saved in before it is written, and knows when validation swapped the
  average in. No public accessor exists (Lightning 2.6): `averaged_model` and `latest_update_step` read
  them, `set_latest_update_step` writes the step. When it breaks: the callback's tests fail; read the new
  attribute names in `weight_averaging.py`.
- `_combined_loader`, `_combined_loader_states_to_load`, `_load_combined_loader_states` and `_data_fetcher`
  of the fit loop: `load_pending_loader_states`. A scheduler sized by `trainer.estimated_stepping_batches`
  (`model.scheduler.total_steps: null`, as OneCycleLR needs) makes Lightning build the training loader before
  it restores a checkpoint, and the loader's saved position is then never loaded: a run resumed mid-epoch was
  given other batches than the uninterrupted run (tests/test_resume.py). Upstream: Lightning issue #20550
  (fixes in PRs #21765 and #21770, open). When it breaks: the attribute error names them; when the fix is
  released, delete it.
"""

import subprocess
from collections.abc import Callable

from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies.launchers import subprocess_script as pytorch_launcher


def saves_within_epochs(checkpoint: ModelCheckpoint) -> bool:
    """Whether a ModelCheckpoint also saves every N training steps or after a training time interval."""
    return checkpoint._every_n_train_steps > 0 or checkpoint._train_time_interval is not None


def deferred_save(checkpoint: ModelCheckpoint) -> bool:
    """Whether a ModelCheckpoint put off a step's save until the next validation."""
    return bool(checkpoint._defer_save_until_validation)


def set_deferred_save(checkpoint: ModelCheckpoint, deferred: bool) -> None:
    checkpoint._defer_save_until_validation = deferred


def set_up_validation_data(trainer: object) -> None:
    """Set up the validation loaders now, as the sanity check of a new run does."""
    trainer.fit_loop.epoch_loop.val_loop.setup_data()


def load_pending_loader_states(trainer: object) -> None:
    """Load the checkpoint's training loader state that Lightning left unloaded (#20550), then start the
    epoch's iterator again from it, as Lightning's own resume does."""
    loop = trainer.fit_loop
    if loop._combined_loader_states_to_load and loop._combined_loader is not None:
        loop._load_combined_loader_states()
        iter(loop._data_fetcher)


def replace_launcher_functions(
    worker_command: Callable[[int], tuple[list[str], str]],
    launch_observer: Callable[[list[subprocess.Popen]], None],
) -> None:
    """Make Lightning's subprocess launcher start DDP worker `local_rank` with `worker_command(local_rank)`
    (its command and cwd), and watch the workers it started with `launch_observer(processes)`."""
    # The pytorch launcher imported the functions by name, so both modules need the replacements.
    for module in (fabric_launcher, pytorch_launcher):
        for name in ("_hydra_subprocess_cmd", "_launch_process_observer"):
            if not hasattr(module, name):
                raise RuntimeError(
                    f"{module.__name__} has no {name}: this Lightning version changed its DDP launcher; "
                    "update src/compat/lightning.py (tested with lightning 2.6)"
                )
        module._hydra_subprocess_cmd = worker_command
        module._launch_process_observer = launch_observer


class WorkerObserver(fabric_launcher._ChildProcessObserver):
    """Lightning's watcher of the DDP workers, for one job only, and optionally sparing this process.

    While the job runs, a worker that died makes it kill the others; unless `spare_main_process`, it also
    kills this process (Lightning's behaviour: it may be stuck in a collective). Once the job has ended
    (`stop()`), the workers' exit codes are no reason to kill anything.
    """

    def __init__(
        self, main_pid: int, child_processes: list[subprocess.Popen], spare_main_process: bool
    ) -> None:
        super().__init__(main_pid=main_pid, child_processes=child_processes)
        self.spare_main_process = spare_main_process

    def stop(self) -> None:
        self._finished = True

    def _run(self) -> bool:
        return self._finished or super()._run()

    def _terminate_all(self) -> None:
        if self._finished:
            return
        if not self.spare_main_process:
            super()._terminate_all()
            return
        for worker in self._child_processes:
            if worker.poll() is None:
                worker.send_signal(self._termination_signal)


def wake_refresh_thread(progress: object) -> None:
    """Give a started progress display of Lightning's RichProgressBar (`bar.progress`) a refresh thread that
    ends at once when stopped; a display without Lightning's thread is left as it is."""
    from lightning.pytorch.callbacks.progress.rich_progress import _RefreshThread

    class _WakingRefreshThread(_RefreshThread):
        """Lightning's refresh thread, waiting on its stop event instead of sleeping."""

        def run(self) -> None:
            while not self.done.wait(1 / self.refresh_per_second):
                if self.refresh_cond:
                    with self.live._lock:
                        self.live.refresh()
                    self.refresh_cond = False

    live = getattr(progress, "live", None)
    thread = getattr(live, "_refresh_thread", None)
    if type(thread) is _RefreshThread:  # Lightning's own: not yet swapped
        thread.stop()  # ends after its current sleep, unjoined (a daemon thread)
        live._refresh_thread = _WakingRefreshThread(live, live.refresh_per_second)
        live._refresh_thread.start()


# part: pretrained
def averaged_model(callback: object) -> object | None:
    """A WeightAveraging callback's running average, an AveragedModel (None before training starts)."""
    return callback._average_model


def latest_update_step(callback: object) -> int:
    """The step of the average's latest update."""
    return callback._latest_update_step


def set_latest_update_step(callback: object, step: int) -> None:
    callback._latest_update_step = step


# /part
