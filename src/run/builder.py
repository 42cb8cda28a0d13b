"""The one place where a run is put together; every entry point builds through `build`.

`build` runs four steps, each below as its own function, in the order that matters:

1. `prepare`: the preflight checks, extras and seeding, before anything is instantiated, so that a bad
   config fails in a second and every object is created under the same seed;
2. `instantiate_run`: datamodule, model, and (for the tasks that use one) callbacks, loggers and trainer;
3. `recorded`: the run record (run.json) at the start and at the end, however the run ends, and the
   resolved config logged as the run's hyperparameters;
4. on the way out, the distributed state is cleaned up, so the next job of a multirun starts from scratch.
"""

import logging
import math
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_object, instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from src.common.config_names import target_class
from src.compat.lightning import saves_within_epochs
from src.launch import environment, hydra_ddp
from src.run import preflight
from src.run import record as run_record
from src.run.extras import apply_extras
from src.run.resume import Resume

log = logging.getLogger(__name__)


@dataclass
class Run:
    """Everything a task needs, built from one config."""

    cfg: DictConfig
    datamodule: L.LightningDataModule | None = None
    model: L.LightningModule | None = None
    trainer: L.Trainer | None = None  # None for a task that runs no Trainer (export)
    metrics: dict[str, float] = field(default_factory=dict)  # the final metrics, set by the task
    tested_checkpoint: str | None = None  # the checkpoint the test metrics came from, set by the task


@contextmanager
def build(
    cfg: DictConfig,
    resume: Resume | None = None,
    model: L.LightningModule | None = None,
    datamodule: L.LightningDataModule | None = None,
    trainer: bool = True,
) -> Iterator[Run]:
    """Prepare, instantiate and record the run of `cfg`; clean up on exit.

    `resume`: the earlier attempt of a named run that this one continues, for the run record.
    `model`, `datamodule`: already built (predict and export load the model from a checkpoint); else from
    `cfg.model` and `cfg.data` (`data: null` for none). `trainer=False`: no callbacks, loggers or Trainer.
    """
    prepare(cfg)
    env_before = hydra_ddp.snapshot_env()
    run = Run(cfg=cfg, datamodule=datamodule, model=model)
    try:
        instantiate_run(run, trainer)
        with recorded(run, resume):
            yield run
    finally:
        _finish_wandb()
        hydra_ddp.cleanup(run.trainer, env_before)


def prepare(cfg: DictConfig) -> None:
    """What happens before anything is instantiated: checks, extras, seed."""
    if HydraConfig.initialized():
        # Imported before Hydra set up logging (by a module that imports lightning at its top), Lightning gives
        # its loggers a console handler of their own and stops their records there: they would miss the run's
        # log file. Hydra's handlers print and file every record, so Lightning's go to them.
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logging.getLogger(name).handlers.clear()
            logging.getLogger(name).propagate = True
    preflight.check_run(cfg)
    apply_extras(cfg)
    if cfg.get("seed") is not None:  # seed 0 is a seed
        L.seed_everything(cfg.seed, workers=True)


def complete_config(cfg: DictConfig) -> None:
    """Let the data fill the keys of the run's config that follow from it (`DataModule.complete_config`), before
    the run is planned: the run record, and a named run's check of its config, see the filled values."""
    if isinstance(cfg.get("data"), DictConfig) and hasattr(data := target_class(cfg.data), "complete_config"):
        data.complete_config(cfg)


def instantiate_run(run: Run, trainer: bool) -> None:
    """The datamodule and model (unless given), then callbacks, loggers and the Trainer."""
    cfg = run.cfg
    if run.datamodule is None and cfg.get("data") is not None:
        log.info(f"Instantiating datamodule <{cfg.data._target_}>")
        # Plain lists and dicts (not ListConfig): checkpoints store the datamodule's hyperparameters and
        # must load with weights_only=True.
        run.datamodule = instantiate(cfg.data, _convert_="all")
    # Checked on the model's class before it is built: a model for other data names data keys this one lacks.
    model_class = type(run.model) if run.model is not None else get_object(cfg.model._target_)
    check_same_task(model_class, run.datamodule)
    if run.model is None:
        log.info(f"Instantiating model <{cfg.model._target_}>")
        run.model = instantiate(cfg.model)
    if trainer:
        callbacks = cfg.get("callbacks")
        callbacks = for_this_task(callbacks, run.model)  # [part: diagnostics]
        callbacks = instantiate_group(callbacks, "callbacks")
        loggers = instantiate_group(cfg.get("logger"), "logger")
        log.info(f"Instantiating trainer <{cfg.trainer._target_}>")
        run.trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
        skip_idle_batch_hooks(run.trainer)


def check_same_task(model_class: type, datamodule: L.LightningDataModule | None) -> None:
    """An error when the data's samples are for another task than the model class's (when both say which)."""
    data_task, model_task = getattr(datamodule, "task", None), getattr(model_class, "task", None)
    if data_task and model_task and data_task != model_task:
        raise ValueError(
            f"the data ({type(datamodule).__name__}) gives {data_task} samples but the model "
            f"({model_class.__name__}) is a {model_task} model; choose a model option for {data_task} "
            "(its model= option) or other data"
        )


# part: diagnostics
def for_this_task(group: DictConfig | None, model: L.LightningModule) -> dict[str, Any]:
    """The entries of a callbacks group that fit the model's task: one whose class lists the tasks it fits
    (`tasks`, e.g. ("classification",)) is left out, with one info line and before it is instantiated, when
    the model's `task` is not among them. (eval.yaml composes the pictures of every task this way.)"""
    task = getattr(model, "task", None)
    fitting = {}
    for name, conf in (group or {}).items():
        try:  # an entry without a known target fails with Hydra's own message when instantiated
            target = get_object(conf._target_)
        except (ImportError, AttributeError, ValueError):
            target = None
        tasks = getattr(target, "tasks", None)
        if tasks is not None and task not in tasks:
            log.info(
                f"{target.__name__} fits {' and '.join(tasks)} models, not {task}: it is left out of this run"
            )
            continue
        fitting[name] = conf
    return fitting


# /part


# The hooks Lightning calls on every callback at every batch.
BATCH_STAGES = ("train", "validation", "test", "predict")
BATCH_HOOKS = {f"on_{stage}_batch_{when}" for stage in BATCH_STAGES for when in ("start", "end")}
BATCH_HOOKS |= {"on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad"}


def skip_idle_batch_hooks(trainer: L.Trainer) -> None:
    """Let Lightning skip the per-batch hooks that do nothing in this run.

    Lightning calls each of these hooks on each callback at every batch, inside a profiler context named
    after the callback, even when the hook is `Callback`'s empty default or returns at once under the
    callback's settings: the calls add up on a small model's step (the template's benchmark showed it).
    Lightning skips a hook that is not callable, so an idle one is set to None on the instance. A real
    profiler (`debug=profiler`) then lists only the hooks that do something.
    """
    for callback in trainer.callbacks:
        for hook in idle_batch_hooks(callback, trainer):
            setattr(callback, hook, None)


def idle_batch_hooks(callback: L.Callback, trainer: L.Trainer) -> set[str]:
    """The per-batch hooks of `callback` that cannot do anything in this run: those it does not implement,
    and those its settings leave idle (a callback of the template says which in `idle_batch_hooks`)."""
    idle = {hook for hook in BATCH_HOOKS if getattr(type(callback), hook) is getattr(L.Callback, hook)}
    if isinstance(callback, ModelCheckpoint) and not saves_within_epochs(callback):
        idle.add("on_train_batch_end")  # it saves after validation or at epoch ends only
    if isinstance(callback, LearningRateMonitor) and callback.logging_interval == "epoch":
        idle.add("on_train_batch_start")  # it logs at epoch starts only
    declared = getattr(callback, "idle_batch_hooks", None)
    if callable(declared):
        idle |= set(declared(trainer))
    return idle


def instantiate_group(group: DictConfig | None, kind: str) -> list[Any]:
    """Instantiate every entry of a config group such as `callbacks` or `logger`; null entries are skipped."""
    objects = []
    for name, conf in (group or {}).items():
        if conf is None:  # `callbacks.early_stopping=null` removes a callback
            continue
        if not isinstance(conf, DictConfig) or "_target_" not in conf:
            raise ValueError(
                f"{kind}.{name} has no _target_; every entry of `{kind}` must be an object config"
            )
        log.info(f"Instantiating {kind}.{name} <{conf._target_}>")
        objects.append(instantiate(conf))
    return objects


@contextmanager
def recorded(run: Run, resume: Resume | None) -> Iterator[None]:
    """Write run.json when the run starts and complete it when it ends (global rank 0 only); log the
    resolved config, parameter counts and the run record to every logger. A SIGTERM'd run exits with
    128 + SIGTERM."""
    loggers = run.trainer.loggers if run.trainer is not None else []
    rank_zero = run.trainer.is_global_zero if run.trainer is not None else environment.is_global_rank_zero()
    record, error = None, None
    try:
        if rank_zero:
            record, diff = run_record.start_record(run.cfg, run.trainer.world_size if run.trainer else 1)
            if resume is not None:
                record["resumed"] = resume.summary()
            params = list(run.model.parameters())
            hparams = record["config"] | {
                "model/params/total": sum(p.numel() for p in params),
                "model/params/trainable": sum(p.numel() for p in params if p.requires_grad),
                "run": run_record.for_loggers(record),
            }
            for logger in loggers:
                logger.log_hyperparams(hparams)
            # A later attempt of a named run logs to the same wandb run (src/run/resume.py).
            record["wandb_id"] = next((lg.version for lg in loggers if isinstance(lg, WandbLogger)), None)
            run_record.write_start(record, diff, run.cfg.paths.output_dir)
        yield
    except BaseException as err:
        # Whatever failed once the record exists, setting up (a logger refusing the hyperparameters, e.g.
        # wandb without a login) or running, the record says so.
        error = err
        if isinstance(err, SIGTERMException):
            # Lightning ends a SIGTERM'd run with SystemExit(None), i.e. exit status 0; a killed run should
            # say it was killed (128 + SIGTERM), like any other process.
            raise SystemExit(128 + signal.SIGTERM) from err
        raise
    finally:
        if record is not None:
            # part: pretrained
            # What the callbacks add to the record: a callback with a `run_record()` method returns its entries
            # (the LR finder's suggestion).
            for callback in run.trainer.callbacks if run.trainer is not None else []:
                if callable(getattr(callback, "run_record", None)):
                    record |= callback.run_record()
            # /part
            run_record.write_end(record, run.cfg.paths.output_dir, run.metrics, error, run.tested_checkpoint)
            if error is None:  # predictions on image files without labels have none
                shown = ", ".join(f"{k}={v:.4f}" for k, v in sorted(run.metrics.items()) if not math.isnan(v))
                log.info(f"Final metrics: {shown or 'none'}")


@rank_zero_only
def _finish_wandb() -> None:
    """End the wandb run, if any, so the next job of a multirun gets its own."""
    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish()
