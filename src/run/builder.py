"""The one place where a run is put together; every entry point (train, eval) builds through `build`.

Order matters: the preflight checks, extras and seeding happen before anything is instantiated, so that
a bad config fails in a second and every object is created under the same seed; the run record
(run.json) is written and the resolved config is logged as the run's hyperparameters; and however the
run ends, the record gets its end and the distributed state is cleaned up, so that the next job of a
multirun starts from scratch.
"""

import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from src.launch import hydra_ddp
from src.run import preflight
from src.run import record as run_record
from src.run.extras import apply_extras
from src.run.resume import Resume

log = logging.getLogger(__name__)


@dataclass
class Run:
    """Everything a task needs, built from one config."""

    cfg: DictConfig
    datamodule: L.LightningDataModule | None
    model: L.LightningModule
    trainer: L.Trainer
    metrics: dict[str, float] = field(default_factory=dict)  # the final metrics, set by the task


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


def log_hyperparameters(run: Run, record: dict[str, Any]) -> None:
    """Send the resolved run config (nested), parameter counts and the run record to every logger."""
    if not run.trainer.loggers:
        return
    hparams = OmegaConf.to_container(run.cfg, resolve=True)
    params = list(run.model.parameters())
    hparams["model/params/total"] = sum(p.numel() for p in params)
    hparams["model/params/trainable"] = sum(p.numel() for p in params if p.requires_grad)
    hparams["run"] = run_record.for_loggers(record)
    for logger in run.trainer.loggers:
        logger.log_hyperparams(hparams)


@rank_zero_only
def _finish_wandb() -> None:
    """End the wandb run, if any, so the next job of a multirun gets its own."""
    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish()


@contextmanager
def build(
    cfg: DictConfig,
    resume: Resume | None = None,
    model: L.LightningModule | None = None,
    datamodule: L.LightningDataModule | None = None,
) -> Iterator[Run]:
    """Seed, instantiate data, model, callbacks, loggers and trainer from `cfg`; clean up on exit.

    `resume`: the earlier attempt of a named run that this one continues, for the run record.
    `model`, `datamodule`: already built (predict and export load the model from a checkpoint); else from
    `cfg.model` and `cfg.data` (`data: null` for none).
    """
    if HydraConfig.initialized():
        # `import lightning` attaches a console handler of its own; Hydra's logging config already prints
        # and files every record, so drop it rather than print each Lightning message twice.
        logging.getLogger("lightning").handlers.clear()
    preflight.check_run(cfg)
    apply_extras(cfg)
    if cfg.get("seed") is not None:  # seed 0 is a seed
        L.seed_everything(cfg.seed, workers=True)
    env_before = hydra_ddp.snapshot_env()
    trainer, record, error = None, None, None
    try:
        if datamodule is None and cfg.get("data") is not None:
            log.info(f"Instantiating datamodule <{cfg.data._target_}>")
            # Plain lists and dicts (not ListConfig): checkpoints store the datamodule's hyperparameters and
            # must load with weights_only=True.
            datamodule = instantiate(cfg.data, _convert_="all")
        if model is None:
            log.info(f"Instantiating model <{cfg.model._target_}>")
            model = instantiate(cfg.model)
        callbacks = instantiate_group(cfg.get("callbacks"), "callbacks")
        loggers = instantiate_group(cfg.get("logger"), "logger")
        log.info(f"Instantiating trainer <{cfg.trainer._target_}>")
        trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
        run = Run(cfg=cfg, datamodule=datamodule, model=model, trainer=trainer)
        if trainer.is_global_zero:
            record, diff = run_record.start_record(cfg, trainer.world_size)
            if resume is not None:
                record["resumed"] = resume.summary()
            log_hyperparameters(run, record)
            # A later attempt of a named run logs to the same wandb run (src/run/resume.py).
            record["wandb_id"] = next(
                (lg.version for lg in trainer.loggers if isinstance(lg, WandbLogger)), None
            )
            run_record.write_start(record, diff, cfg.paths.output_dir)
        try:
            yield run
        except SIGTERMException as err:
            error = err
            # Lightning ends a SIGTERM'd run with SystemExit(None), i.e. exit status 0; a killed run should
            # say it was killed (128 + SIGTERM), like any other process.
            raise SystemExit(128 + signal.SIGTERM) from err
    except BaseException as err:
        # Whatever failed once the record exists, setting up (a logger refusing the hyperparameters, e.g.
        # wandb without a login) or running, the record says so.
        error = error or err
        raise
    finally:
        if record is not None:
            run_record.write_end(record, cfg.paths.output_dir, run.metrics, error)
        _finish_wandb()
        hydra_ddp.cleanup(trainer, env_before)
