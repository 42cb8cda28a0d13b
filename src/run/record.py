"""The run record: what ran, from which code, on what machine, and how it ended.

Written as <run dir>/run.json when a run starts (with <run dir>/git.diff when the working tree has
uncommitted changes) and completed when it ends; the builder also sends it, without the config that is
already there, to every logger as part of the hyperparameters. Only global rank 0 writes it.
"""

import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from src.common.files import write_atomically

RECORD_FILE = "run.json"
DIFF_FILE = "git.diff"
# Filled in by write_end.
_END_FIELDS = ("end_time", "duration_s", "error", "final_metrics", "tested_checkpoint")
PACKAGES = ("torch", "torchvision", "lightning", "torchmetrics", "hydra-core", "omegaconf")


def git_state(root: str | Path) -> dict[str, Any]:
    """Commit, branch and dirty flag of the repository holding `root`, and the diff of its tracked files.

    Every field is None outside a git repository or without a git executable.
    """

    def git(*args: str) -> str | None:
        try:
            result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return result.stdout if result.returncode == 0 else None

    commit, branch = git("rev-parse", "HEAD"), git("rev-parse", "--abbrev-ref", "HEAD")
    if commit is None:
        return dict.fromkeys(("commit", "branch", "dirty", "diff"))
    diff = git("diff", "HEAD")  # staged and unstaged changes of tracked files
    return {
        "commit": commit.strip(),
        "branch": branch and branch.strip(),
        "dirty": bool(diff),
        "diff": diff or None,
    }


def start_record(cfg: DictConfig, world_size: int) -> tuple[dict[str, Any], str | None]:
    """Everything known when a run starts (`config` is the resolved run config), and the git diff."""
    import torch

    overrides = HydraConfig.get().overrides if HydraConfig.initialized() else {"task": [], "hydra": []}
    git = git_state(cfg.paths.root_dir)
    diff = git.pop("diff")
    cudnn = torch.backends.cudnn.version()
    return {
        "task": cfg.get("task_name"),
        "run_dir": str(cfg.paths.output_dir),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "overrides": {key: list(overrides[key]) for key in ("task", "hydra")},
        "git": git | {"diff_file": DIFF_FILE if diff else None},
        "versions": {
            "python": platform.python_version(),
            "cuda": torch.version.cuda,
            "cudnn": cudnn and str(cudnn),
        }
        | {package: version(package) for package in PACKAGES},
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        },
        "world_size": world_size,
        "seed": cfg.get("seed"),
        "start_time": datetime.now().astimezone().isoformat(timespec="seconds"),
        "status": "running",
        **dict.fromkeys(_END_FIELDS),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }, diff


def write_start(record: dict[str, Any], diff: str | None, run_dir: str | Path) -> None:
    """Write run.json (and git.diff when there are uncommitted changes) into the run dir."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    if diff:
        (Path(run_dir) / DIFF_FILE).write_text(diff)
    _write(run_dir, record)


def write_end(
    record: dict[str, Any],
    run_dir: str | Path,
    metrics: dict[str, float],
    error: BaseException | None,
    tested_checkpoint: str | None = None,
) -> None:
    """Complete run.json: end time, duration, status (completed, failed, interrupted), final metrics, and
    the checkpoint the test metrics came from (relative to the run dir when inside it)."""
    end = datetime.now().astimezone()
    if tested_checkpoint is not None:
        tested, root = Path(tested_checkpoint).resolve(), Path(run_dir).resolve()
        if tested.is_relative_to(root):
            tested_checkpoint = str(tested.relative_to(root))
    stopped = isinstance(error, KeyboardInterrupt | SystemExit)  # Lightning turns Ctrl+C into sys.exit(1)
    record |= {
        "end_time": end.isoformat(timespec="seconds"),
        "duration_s": round((end - datetime.fromisoformat(record["start_time"])).total_seconds(), 1),
        "status": "completed" if error is None else "interrupted" if stopped else "failed",
        "error": error and f"{type(error).__name__}: {error}",
        "final_metrics": dict(sorted(metrics.items())),
        "tested_checkpoint": tested_checkpoint,
    }
    _write(run_dir, record)


def for_loggers(record: dict[str, Any]) -> dict[str, Any]:
    """The record as hyperparameters: what is known at the start, without the config (logged beside it)
    and without the earlier attempt's record (only the checkpoint this attempt continues from)."""
    logged = {key: value for key, value in record.items() if key not in ("config", *_END_FIELDS)}
    if "resumed" in logged:
        logged["resumed"] = {"checkpoint": logged["resumed"]["checkpoint"]}
    return logged


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A recorded config as dotted keys (`model.optimizer.lr`), to compare runs and attempts key by key."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _write(run_dir: str | Path, record: dict[str, Any]) -> None:
    write_atomically(Path(run_dir) / RECORD_FILE, json.dumps(record, indent=2, default=str) + "\n")
