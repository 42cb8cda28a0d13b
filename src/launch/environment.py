"""What external launchers (torchrun, SLURM's srun) tell a process, read before Hydra creates the run dir.

torchrun and srun start every rank as its own `python src/train.py ...` process, so each would create its
own timestamped run directory, snapshot and log file. The config resolvers use these helpers so that every
rank of one launch agrees on one run directory, and only global rank 0 writes into it.

Kept free of heavy imports: the config resolvers load this module on every start.
"""

import os
from datetime import datetime, timedelta
from pathlib import Path

# The run-dir timestamp: sortable, and unique even for runs started in the same second.
STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S_%f"

# Key under which torchrun's rank 0 publishes its run-dir name in the launch's store.
_STAMP_KEY = "lightning_hydra_starter/run_dir_name"


def is_global_rank_zero() -> bool:
    """False in every process but global rank 0 of a torchrun, SLURM or Lightning-launched job."""
    for name in ("RANK", "SLURM_PROCID"):  # torchrun's global rank first: `srun torchrun` sets both
        if name in os.environ:
            return int(os.environ[name]) == 0
    # A worker started by Lightning's own DDP launcher (or a node of a hand-launched multi-node run).
    return int(os.environ.get("LOCAL_RANK", 0)) == 0 and int(os.environ.get("NODE_RANK", 0)) == 0


def slurm_job_id() -> str | None:
    """The SLURM job id (`<array job>_<task>` in an array), when Lightning runs this process as a SLURM task.

    Mirrors Lightning's `SLURMEnvironment.detect()`: srun sets SLURM_NTASKS, and jobs named "bash" or
    "interactive" are interactive allocations that Lightning leaves alone.
    """
    if "SLURM_NTASKS" not in os.environ or os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def torchrun_world_size() -> int:
    """Number of processes torchrun started for this launch (0 when not started by torchrun)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return 0
    return int(os.environ.get("WORLD_SIZE", 1))


def run_dir_name(runs_dir: str, run_name: str | None = None, resume: str = "auto") -> str:
    """Name of this run's directory below `runs_dir`, the same in every process of one launch.

    A named run (`run_name=my-exp`) gets that name, so running the same command again finds it and can
    resume it; with `resume=never` an existing one is left alone and the run takes the first free
    `my-exp-2`, `my-exp-3`, ... Under SLURM an unnamed run is `slurm-<job id>`: every task of the job, and
    the job again after a requeue, writes there. Otherwise it is the current time. Under torchrun, global
    rank 0 decides and shares the name through the launch's TCP store.
    """
    if run_name is not None:
        run_name = str(run_name)
        if not run_name or run_name in (".", "..") or any(c in run_name for c in "/\\"):
            raise ValueError(
                f"run_name={run_name!r} is not a valid directory name; use letters, digits, - _ ."
            )
        name = run_name
        if resume == "never":
            number = 1
            while (Path(runs_dir) / name).exists():
                number += 1
                name = f"{run_name}-{number}"
    elif (job_id := slurm_job_id()) is not None:
        name = f"slurm-{job_id}"
    else:
        name = datetime.now().strftime(STAMP_FORMAT)
    # torchrun's agent serves a TCP store at MASTER_ADDR:MASTER_PORT (every rendezvous since torch 2.3).
    if torchrun_world_size() > 1 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        name = _share_from_rank_zero(_STAMP_KEY, name)
    return name


def _share_from_rank_zero(key: str, value: str, timeout_s: float = 300.0) -> str:
    """Rank 0's `value` for `key`, read from the TCP store that torchrun's agent serves at MASTER_ADDR:PORT.

    A worker restarted by torchrun (`--max-restarts`) finds the key already set and reuses the same value.
    """
    from torch.distributed import TCPStore  # only under torchrun: torch is loaded there anyway

    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
    )
    if is_global_rank_zero() and not store.check([key]):
        store.set(key, value)
    return store.get(key).decode()  # blocks until rank 0 has set it
