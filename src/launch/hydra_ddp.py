"""DDP under Hydra: start each worker process on exactly the current job, and leave no state behind.

Lightning's DDP launcher restarts the script for every extra local rank with the *original* command line.
Under `-m` that command still holds `-m` and the whole sweep, so each worker ran its own copy of the sweep
(a second multirun directory; with an unseeded sampler, ranks of one DDP job trained different
hyperparameters). And the `LOCAL_RANK`/`MASTER_*` variables the launcher sets stay in `os.environ`, so the
next job of the sweep believed its workers already existed and started none.

And Lightning watches the workers with a thread that SIGKILLs the main process as soon as one worker has
exited with an error, even after the job has ended. Under a sweep the main process is the sweeper, so a
trial that failed (or was pruned) in its workers killed the whole sweep.

`install()` makes the launcher build each worker's command from the job's own resolved overrides and
output directory, and watch the workers with `WorkerObserver` (Lightning's watcher made stoppable, sparing
the sweeper's process; src/compat/lightning.py holds it, with the private launcher names it replaces);
`cleanup()` ends a job: it destroys the process group (gloo otherwise aborts at exit in some runs), stops
the observer, waits for the workers, and restores the environment the job started with. `ddp_spawn` starts
its workers without re-running the script; `SpawnDDPStrategy` gives them the same clean exit.
"""

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch.distributed
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_original_cwd
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DDPStrategy

from src.compat.lightning import WorkerObserver, replace_launcher_functions

# What Lightning's launcher (or torchrun / SLURM) sets for a distributed job.
DISTRIBUTED_ENV_VARS = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# Hydra settings of the parent that must not reach a worker: it runs one job, in the parent's job dir.
_PARENT_ONLY_HYDRA_OVERRIDES = (
    "hydra.mode",
    "hydra.run.",
    "hydra.sweep.",
    "hydra.sweeper",
    "hydra/sweeper",
    "hydra.launcher",
    "hydra/launcher",
    "hydra.job.name",
    "hydra.output_subdir",
)


def worker_command(script: str, local_rank: int) -> tuple[list[str], str]:
    """Command and cwd that start DDP worker `local_rank` of `script` on the current job, and only that job."""
    hydra_cfg = HydraConfig.get()
    # The flags that find the job's configs again, from the job's own Hydra config rather than sys.argv:
    # inside a launcher plugin's job (a cluster's) the command line is the plugin's.
    flags = {"main": "--config-path", "command-line": "--config-dir"}
    command = [sys.executable, script, f"--config-name={hydra_cfg.job.config_name}"]
    command += [
        f"{flags[source.provider]}={source.path}"
        for source in hydra_cfg.runtime.config_sources
        if source.schema == "file" and source.provider in flags
    ]
    command += [o for o in hydra_cfg.overrides.hydra if not o.startswith(_PARENT_ONLY_HYDRA_OVERRIDES)]
    command += list(hydra_cfg.overrides.task)
    # The parent's run dir; the config (hydra/default.yaml) keeps a worker from writing the config
    # snapshot or the log file there: those are global rank 0's.
    command += [
        f'hydra.run.dir="{hydra_cfg.runtime.output_dir}"',
        f"hydra.job.name={hydra_cfg.job.name}_ddp_rank_{local_rank}",
    ]
    return command, get_original_cwd()


_observers: list[WorkerObserver] = []


def _launch_job_observer(child_processes: list[subprocess.Popen]) -> None:
    """Watch one job's workers; inside a sweep, a failed worker fails its job, not the sweeper's process."""
    in_sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    observer = WorkerObserver(os.getpid(), child_processes, spare_main_process=in_sweep)
    _observers.append(observer)
    observer.start()


def install(script: str) -> None:
    """Make Lightning's subprocess launcher start each DDP worker as `script` on the current job.

    Every entry point calls this with its own `__file__`; that path, unlike sys.argv, is also right
    inside a launcher plugin's job.
    """
    replace_launcher_functions(
        functools.partial(worker_command, str(Path(script).resolve())), _launch_job_observer
    )


def snapshot_env() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in DISTRIBUTED_ENV_VARS}


def cleanup(trainer: Trainer | None, env_before: dict[str, str | None], timeout: float = 120.0) -> None:
    """End a job's distributed state: process group, worker processes, environment variables."""
    while _observers:  # first: the workers may now exit, with an error if the job failed
        _observers.pop().stop()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    launcher = getattr(trainer.strategy, "launcher", None) if trainer is not None else None
    # The script workers of Lightning's subprocess launcher (ddp_spawn's launcher joins its own).
    workers = [p for p in getattr(launcher, "procs", []) if isinstance(p, subprocess.Popen)]
    for worker in workers:
        try:
            worker.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
            raise RuntimeError(
                f"DDP worker process {worker.pid} did not exit within {timeout:.0f} s"
            ) from None
    for name, value in env_before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class SpawnDDPStrategy(DDPStrategy):
    """`ddp_spawn` (workers started by torch.multiprocessing) whose workers destroy their process group.

    Without it gloo aborts some workers at interpreter exit ("terminate called without an active
    exception", SIGABRT), which fails the job after training succeeded.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(start_method="spawn", **kwargs)

    def teardown(self) -> None:
        super().teardown()
        # A no-op in the main process, which never joins the group; each worker ends here.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
