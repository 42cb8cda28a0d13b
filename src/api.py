"""The project from Python (a notebook, a script, a test): run a task as `python src/<task>.py` runs it, and
open a trained run.

    from src import api

    run = api.train(["data=digits", "trainer.max_epochs=3"])  # = python src/train.py data=digits ...
    run.metrics["test/acc"], run.run_dir
    trained = api.load_run(run.run_dir)  # its model, data, config and class names
    api.evaluate([f"run_dir={run.run_dir}"])

Each call is one run with the command line's rules (run_name, resume, preflight) and everything it leaves:
a run directory with run.json, its log file and the .hydra/ snapshot. docs/python-api.md says more.
"""

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from src import tasks
from src.common.config_names import resolved_accelerator
from src.compat.hydra import run_task
from src.inference import tasks as inference_tasks  # [part: predict]
from src.run.checkpoints import check_fits
from src.run.trained_run import locate, read_record
from src.train import CONFIG_DIR


@dataclass(frozen=True)
class Result:
    """What a task run left: its run directory, and the final metrics its run.json records."""

    run_dir: Path
    metrics: dict[str, float]


def compose(task: str = "train", overrides: Sequence[str] = ()) -> DictConfig:
    """The config `python src/<task>.py overrides` would run, to read or to instantiate parts of
    (`instantiate(cfg.data)`); its run directory is chosen only when a task runs it."""
    with initialize_config_dir(CONFIG_DIR, version_base="1.3", job_name=task):
        return hydra_compose(task, overrides=list(overrides), return_hydra_config=True)


def train(overrides: Sequence[str] = ()) -> Result:
    """`python src/train.py overrides`: fit (continuing a named run where it stopped), then test."""
    return _run("train", tasks.train, overrides)


def evaluate(overrides: Sequence[str] = ()) -> Result:
    """`python src/eval.py overrides`: test a run's checkpoint (`run_dir=...` or `ckpt_path=...`)."""
    return _run("eval", tasks.evaluate, overrides)


# part: predict
def predict(overrides: Sequence[str] = ()) -> Result:
    """`python src/predict.py overrides`: predictions.csv and .json in the result's run_dir."""
    return _run("predict", inference_tasks.predict, overrides)


def export(overrides: Sequence[str] = ()) -> Result:
    """`python src/export.py overrides`: the artifact beside the checkpoint (or at `output=`)."""
    return _run("export", inference_tasks.export, overrides)


# /part


# part: streaming
def shard(overrides: Sequence[str] = ()) -> Result:
    """`python src/shard.py overrides`: a data option's splits written as shards for data=streaming."""
    from src.sharding import shard as write_shards  # litdata, imported only to shard

    return _run("shard", write_shards, overrides)


# /part


@dataclass
class LoadedRun:
    """A trained run, ready to look into: the model in eval mode with the checkpoint's weights, on the device
    the run trained on when this machine has one (else the CPU), and the datamodule set up on the run's splits."""

    run_dir: Path
    checkpoint: Path  # the one its test used (run.json's tested_checkpoint), else best.ckpt, else last.ckpt
    config: DictConfig  # the run's resolved config, as run.json records it
    model: L.LightningModule
    datamodule: L.LightningDataModule
    class_names: list[str] | None  # None: the classes are their indices


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None) -> LoadedRun:
    """Open the run in `run_dir` as eval would test it (or with `checkpoint`, another of its checkpoints).
    A checkpoint that does not fit the run's model is refused, naming the tensors that differ."""
    source = locate(
        OmegaConf.create({"run_dir": str(run_dir), "ckpt_path": checkpoint, "task_name": "load_run"})
    )
    if source.run_config is None:
        raise FileNotFoundError(f"run_dir={run_dir} has no run.json: give the directory of a training run")
    cfg = OmegaConf.create(source.run_config)
    model = instantiate(cfg.model)
    check_fits(model, source.checkpoint)  # loads its weights into the model, or refuses it
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    for stage in ("fit", "test"):
        datamodule.setup(stage)
    device = resolved_accelerator(cfg.trainer.get("accelerator", "auto"))
    present = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    model = model.to(device if present.get(device, device == "cpu") else "cpu").eval()
    names = model.label_names() if hasattr(model, "label_names") else None
    return LoadedRun(Path(run_dir), source.checkpoint, cfg, model, datamodule, names)


def _run(task_name: str, task: Callable[[DictConfig], Any], overrides: Sequence[str]) -> Result:
    """`task` run by Hydra as `python src/<task_name>.py overrides` runs it; its run dir and final metrics."""
    run_dirs: list[Path] = []

    def job(cfg: DictConfig) -> None:
        run_dirs.append(Path(HydraConfig.get().runtime.output_dir))
        task(cfg)

    # sys.argv as the command that runs the same, for run.json's `command` (a kernel's own would not say how);
    # afterwards the caller's logging (Hydra points the root logger at the run's log file), environment
    # (Lightning's PL_GLOBAL_SEED, a logger's settings) and Ctrl+C (Lightning ignores it after a first one)
    # as they were.
    argv, environ, sigint = sys.argv, dict(os.environ), signal.getsignal(signal.SIGINT)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    sys.argv = [f"src/{task_name}.py", *overrides]
    try:
        run_task(CONFIG_DIR, task_name, job, list(overrides))
    finally:
        sys.argv = argv
        os.environ.clear()
        os.environ.update(environ)
        for handler in set(root.handlers) - set(handlers):
            handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        if threading.current_thread() is threading.main_thread():  # where Python handles signals
            signal.signal(signal.SIGINT, sigint)
    record = read_record(run_dirs[0]) or {}
    return Result(run_dirs[0], record.get("final_metrics") or {})
