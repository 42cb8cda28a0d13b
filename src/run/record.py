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
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

RECORD_FILE = "run.json"
DIFF_FILE = "git.diff"
_END_FIELDS = ("end_time", "duration_s", "error", "final_metrics")  # filled in by write_end
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

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "branch": None, "dirty": None, "diff": None}
    diff = git("diff", "HEAD") or ""  # staged and unstaged changes of tracked files
    return {
        "commit": commit.strip(),
        "branch": (git("rev-parse", "--abbrev-ref", "HEAD") or "").strip() or None,
        "dirty": bool(diff),
        "diff": diff or None,
    }


def versions() -> dict[str, str | None]:
    """Python, the main packages, and CUDA/cuDNN as torch sees them (None where absent)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    import torch

    found["cuda"] = torch.version.cuda
    found["cudnn"] = str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None
    return found


def start_record(cfg: DictConfig, world_size: int) -> tuple[dict[str, Any], str | None]:
    """Everything known when a run starts (`config` is the resolved run config), and the git diff."""
    import torch

    hydra = HydraConfig.get() if HydraConfig.initialized() else None
    git = git_state(cfg.paths.root_dir)
    return {
        "task": cfg.get("task_name"),
        "run_dir": str(cfg.paths.output_dir),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "overrides": {
            "task": list(hydra.overrides.task) if hydra else [],
            "hydra": list(hydra.overrides.hydra) if hydra else [],
        },
        "git": {key: value for key, value in git.items() if key != "diff"}
        | {"diff_file": DIFF_FILE if git["diff"] else None},
        "versions": versions(),
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        },
        "world_size": world_size,
        "seed": cfg.get("seed"),
        "start_time": _now(),
        "end_time": None,
        "duration_s": None,
        "status": "running",
        "error": None,
        "final_metrics": None,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }, git["diff"]


def write_start(record: dict[str, Any], diff: str | None, run_dir: str | Path) -> None:
    """Write run.json (and git.diff when there are uncommitted changes) into the run dir."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if diff:
        (run_dir / DIFF_FILE).write_text(diff)
    _write(run_dir / RECORD_FILE, record)


def write_end(
    record: dict[str, Any], run_dir: str | Path, metrics: dict[str, float], error: BaseException | None
) -> None:
    """Complete run.json: end time, duration, status (completed, failed, interrupted), final metrics."""
    end = datetime.now().astimezone()
    record["end_time"] = end.isoformat(timespec="seconds")
    record["duration_s"] = round((end - datetime.fromisoformat(record["start_time"])).total_seconds(), 1)
    if error is None:
        record["status"] = "completed"
    else:
        # Lightning turns Ctrl+C during fit into sys.exit(1).
        record["status"] = "interrupted" if isinstance(error, KeyboardInterrupt | SystemExit) else "failed"
        record["error"] = f"{type(error).__name__}: {error}"
    record["final_metrics"] = {name: value for name, value in sorted(metrics.items())}
    _write(Path(run_dir) / RECORD_FILE, record)


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


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def _write(path: Path, record: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(temporary, path)
