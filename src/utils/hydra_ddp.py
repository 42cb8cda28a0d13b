"""DDP under Hydra: start each worker process on exactly the current job, and leave no state behind.

Lightning's DDP launcher restarts the script for every extra local rank with the *original* command line.
Under `-m` that command still holds `-m` and the whole sweep, so each worker ran its own copy of the sweep
(a second multirun directory; with an unseeded sampler, ranks of one DDP job trained different
hyperparameters). And the `LOCAL_RANK`/`MASTER_*` variables the launcher sets stay in `os.environ`, so the
next job of the sweep believed its workers already existed and started none.

`install()` makes the launcher build each worker's command from the job's own resolved overrides and
output directory; `cleanup()` ends a job: it destroys the process group (gloo otherwise aborts at exit in
some runs), waits for the workers, and restores the environment the job started with.
"""

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence

import torch.distributed
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_original_cwd, to_absolute_path
from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
from lightning.pytorch import Trainer
from lightning.pytorch.strategies.launchers import subprocess_script as pytorch_launcher

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


def _config_location_args(argv: Sequence[str]) -> list[str]:
    """The `--config-path/-cp`, `--config-name/-cn` and `--config-dir/-cd` flags of a Hydra command line."""
    parser = argparse.ArgumentParser(add_help=False)
    for flags in (("--config-path", "-cp"), ("--config-name", "-cn"), ("--config-dir", "-cd")):
        parser.add_argument(*flags)
    known, _ = parser.parse_known_args(list(argv))
    args = []
    for flag, value in (("--config-path", known.config_path), ("--config-name", known.config_name)):
        if value is not None:
            args.append(f"{flag}={value}")
    if known.config_dir is not None:
        args.append(f"--config-dir={to_absolute_path(known.config_dir)}")
    return args


def worker_command(local_rank: int) -> tuple[list[str], str]:
    """Command and cwd that start DDP worker `local_rank` on the current Hydra job, and only that job."""
    import __main__

    hydra_cfg = HydraConfig.get()
    if __main__.__spec__ is None:
        command = [sys.executable, to_absolute_path(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    command += _config_location_args(sys.argv[1:])
    command += [o for o in hydra_cfg.overrides.hydra if not o.startswith(_PARENT_ONLY_HYDRA_OVERRIDES)]
    command += list(hydra_cfg.overrides.task)
    command += [
        f'hydra.run.dir="{hydra_cfg.runtime.output_dir}"',
        f"hydra.job.name={hydra_cfg.job.name}_ddp_rank_{local_rank}",
        "hydra.output_subdir=null",  # the parent alone writes the config snapshot
        "hydra.job_logging.root.handlers=[console]",  # and the run's log file
    ]
    return command, get_original_cwd()


def install() -> None:
    """Make Lightning's subprocess launcher start workers with `worker_command` (idempotent)."""
    # The pytorch launcher imported the function by name, so both modules need the replacement.
    for module in (fabric_launcher, pytorch_launcher):
        if not hasattr(module, "_hydra_subprocess_cmd"):
            raise RuntimeError(
                f"{module.__name__} has no _hydra_subprocess_cmd: this Lightning version changed its DDP "
                "launcher; update src/utils/hydra_ddp.py (tested with lightning 2.6)"
            )
        module._hydra_subprocess_cmd = worker_command


def snapshot_env() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in DISTRIBUTED_ENV_VARS}


def cleanup(trainer: Trainer | None, env_before: dict[str, str | None], timeout: float = 120.0) -> None:
    """End a job's distributed state: process group, worker processes, environment variables."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    launcher = getattr(trainer.strategy, "launcher", None) if trainer is not None else None
    workers: list[subprocess.Popen] = getattr(launcher, "procs", [])
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
