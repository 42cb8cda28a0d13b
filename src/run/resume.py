"""Continuing a named run: find where it stopped, check that it may continue, and pick up its wandb run.

`python src/train.py run_name=my-exp` always writes to logs/train/runs/my-exp. When that directory holds an
earlier attempt (its run.json says so) and `resume=auto`, training continues from the attempt's newest
checkpoint: last.ckpt, a periodic step checkpoint, interrupted.ckpt (SIGTERM, Ctrl+C, an error) or SLURM's
hpc_ckpt_<n>.ckpt. A finished run, or one started with another config, is refused with the way out.
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from src.run.checkpoints import cut_short_writes
from src.run.record import RECORD_FILE, flatten

log = logging.getLogger(__name__)

RESUME_MODES = ("auto", "never")
# Config keys that may change between attempts of one run: where things are written or how they are shown.
MAY_CHANGE = ("resume", "ckpt_path", "extras", "logger", "paths.work_dir")


@dataclass
class Resume:
    """The attempt a run continues: its run record, and the checkpoint to continue from (None: from scratch)."""

    previous: dict[str, Any]
    checkpoint: Path | None

    def summary(self) -> dict[str, Any]:
        """What the run record keeps about it."""
        previous = {key: value for key, value in self.previous.items() if key != "config"}
        return {"checkpoint": str(self.checkpoint) if self.checkpoint else None, "previous": previous}


def plan_resume(cfg: DictConfig) -> Resume | None:
    """None for a new run; the attempt to continue when the run dir already holds one (a named run), whose
    wandb run this attempt then logs to."""
    mode = cfg.get("resume", "never")
    if mode not in RESUME_MODES:
        raise ValueError(
            f"resume={mode} is not valid; choose auto (continue a named run from its newest checkpoint) or "
            "never (start a new run beside it)"
        )
    run_dir = Path(cfg.paths.output_dir)
    record_file = run_dir / RECORD_FILE
    if not record_file.exists():
        return None
    previous = json.loads(record_file.read_text())
    name = run_dir.name
    if previous.get("status") == "completed":
        raise FileExistsError(
            f"run {name} ({run_dir}) already finished on {previous.get('end_time')}; to train again start a new "
            f"run: resume=never (it becomes {name}-2) or another run_name"
        )
    changes = config_changes(previous.get("config") or {}, OmegaConf.to_container(cfg, resolve=True))
    if changes:
        raise ValueError(
            f"run {name} was started with another config ({'; '.join(changes)}); continue it with the same "
            f"settings, or start a new run: resume=never (it becomes {name}-2) or another run_name"
        )
    if previous.get("wandb_id") and "wandb" in (cfg.get("logger") or {}):
        with open_dict(cfg):
            cfg.logger.wandb.id = previous["wandb_id"]
            cfg.logger.wandb.resume = "allow"
    for partial in cut_short_writes(run_dir / "checkpoints"):
        partial.unlink(missing_ok=True)  # another rank of this run may have removed it already
        log.info(f"Removed {partial.name}: a checkpoint write that the stop cut short")
    checkpoint = newest_checkpoint(run_dir)
    if checkpoint is None:
        log.warning(f"Run {name} stopped before its first checkpoint: training it again from the start")
    else:
        log.info(f"Resuming run {name} (stopped {previous.get('status')}) from {checkpoint}")
    return Resume(previous=previous, checkpoint=checkpoint)


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The most recently written checkpoint of a run: where its training got furthest."""
    candidates = [*run_dir.glob("checkpoints/*.ckpt"), *run_dir.glob("hpc_ckpt_*.ckpt")]
    candidates = [path for path in candidates if path.is_file() and path.name != "best.ckpt"]
    return max(candidates, key=lambda path: path.stat().st_mtime, default=None)


def config_changes(before: dict[str, Any], now: dict[str, Any], limit: int = 8) -> list[str]:
    """`key: old -> new` for every setting that differs, except those that may change (MAY_CHANGE)."""
    old, new = flatten(before), flatten(now)
    keys = sorted(
        key
        for key in old.keys() | new.keys()
        if old.get(key) != new.get(key) and not key.startswith(MAY_CHANGE)
    )
    changes = [f"{key}: {old.get(key, '(absent)')} -> {new.get(key, '(absent)')}" for key in keys]
    return changes[:limit] + ([f"and {len(changes) - limit} more"] if len(changes) > limit else [])
