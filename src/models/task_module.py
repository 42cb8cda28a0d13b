"""What the LightningModule of every supervised task shares (classification, segmentation, your next one).

A task module subclasses `TaskModule` and says three things for training: how a batch becomes a loss,
predictions and targets (`step`), which metrics each stage tracks (`stage_metrics`), and what a prediction is
(`predict_step`). A project that predicts and exports asks two more of it: how its predictions are written,
and what its net's output means in an export; a module without them trains and evaluates. Everything else is
here: the net, optimizer and scheduler built from configs kept as plain data, torch.compile and channels-last,
a loss mean and the metrics per stage, updated each step and logged once an epoch, their states in
checkpoints, and the best value so far of the watched metric.
"""

from collections.abc import Mapping
from pathlib import Path  # [part: predict]
from typing import Any

import hydra
import lightning as L
import torch
from omegaconf import (
    DictConfig,  # [part: predict]
    OmegaConf,
)
from torch import Tensor
from torchmetrics import MaxMetric, MeanMetric, Metric, MetricCollection, MinMetric

from src.common.classes import names_or_indices
from src.compat.lightning import load_pending_loader_states
from src.models import finetuning  # [part: pretrained]

STAGES = ("train", "val", "test")


def plain(config: Any) -> Any:
    """A config as plain dicts and lists, so checkpoints hold only data that `weights_only=True` loads."""
    return OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else config


class TaskModule(L.LightningModule):
    """Base LightningModule whose net, optimizer and scheduler are Hydra configs.

    The module instantiates them itself and saves only their configs, with the subclass's own arguments
    (`task_hparams`), as hyperparameters: a checkpoint then holds plain data (no pickled modules or
    partials), loads with `weights_only=True`, and `<Module>.load_from_checkpoint(path)` rebuilds the same net.

    `monitor` and `mode`: the validation metric whose best value so far is logged as `<monitor>_best`, and
    which way it is better (max or min). `preprocessing` need not be given: it is taken from the datamodule
    when training starts and saved with every checkpoint, so that predict and export need nothing else.
    """

    task = "any"  # the kind of task, for callbacks that fit only some (classification, segmentation)
    check_config = staticmethod(finetuning.check_config)  # [part: pretrained]

    def __init__(
        self,
        net: dict,
        optimizer: dict,
        scheduler: dict | None = None,
        scheduler_config: dict | None = None,
        compile: bool = False,
        channels_last: bool = False,
        preprocessing: dict | None = None,
        monitor: str = "val/loss",
        mode: str = "min",
        **task_hparams: Any,
    ) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"mode={mode} is not valid; choose max or min")
        super().__init__()
        # Every __init__ argument, the subclass's too (Lightning collects them), as plain data; the builder logs
        # the whole resolved run config instead.
        self.save_hyperparameters(logger=False)
        for name, value in self.hparams.items():
            self.hparams[name] = plain(value)
        self.net = hydra.utils.instantiate(self.hparams.net)
        finetuning.check(self.net, self.hparams)  # [part: pretrained]
        # Each stage's loss mean and task metrics, one collection each (`train_metrics`, ...): torchmetrics keeps
        # their states apart and syncs them across ranks. No NaN check in the loss mean: it would read the value
        # back to the host every step (a GPU sync); the training_guards callback stops on a NaN loss instead.
        for stage in STAGES:
            metrics = {"loss": MeanMetric(nan_strategy="disable"), **self.stage_metrics(stage)}
            setattr(self, f"{stage}_metrics", MetricCollection(metrics, compute_groups=False))
        self.monitor_best = MaxMetric() if mode == "max" else MinMetric()
        # Training metric states go into checkpoints: a run resumed mid-epoch (or after its best epoch)
        # reports the same epoch means and best value as an uninterrupted one.
        self.train_metrics.persistent(True)
        self.monitor_best.persistent(True)

    # --- what a task says ---

    def stage_metrics(self, stage: str) -> dict[str, Metric]:
        """The metrics of `stage` (train, val, test) by name, each updated with `(preds, targets)` of `step`.
        A metric that computes one value per class is logged as `<stage>/<name>_<class name>`."""
        return {}

    def step(self, batch: Any) -> tuple[Tensor, Tensor, Tensor]:
        """The batch's loss, the predictions the metrics take, and the targets."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def initial_loss(self) -> tuple[float, str] | None:
        """What the loss of the untrained model should be about, and why, for the training guard's first-step
        check (callbacks/training_guards.py); None: no expectation."""
        return None

    def label_names(self) -> list[str] | None:
        """The names of the classes (or other outputs) per-class metrics are logged under; None: indices."""
        return self.hparams.get("class_names")

    # part: predict
    # --- what a task says for predict and export (training needs neither) ---

    def prediction_writer(self, cfg: DictConfig, out_dir: Path) -> Any:
        """What turns this task's `predict_step` outputs into files in `out_dir` and metrics (see
        PredictionWriter); `cfg` is the predict run's config, for the task's own keys (top_k)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not say how its predictions are written: implement prediction_writer() "
            "in it (see TaskModule in src/models/task_module.py)"
        )

    def output_description(self) -> dict[str, Any]:
        """What the net's output is, for the `output` entry of an export's <artifact>.json: its `name` (also the
        ONNX output's), its `shape` ("batch" for the batch axis) and how to read it."""
        raise NotImplementedError(
            f"{type(self).__name__} does not say what its net's output means: implement output_description() "
            "in it (see TaskModule in src/models/task_module.py)"
        )

    def export_inputs(self, batch: Any) -> list[dict[str, Tensor]]:
        """The batches of net inputs, by name (an ONNX export's input names), that an export is traced with
        (the first) and checked on (each), from a batch of the data's inputs: the images, and their first few
        (a second batch size)."""
        return [{"images": batch}, {"images": batch[: max(1, len(batch) // 2 - 1)]}]

    def export_axes(self) -> dict[str, dict[int, Any]]:
        """Each input's dynamic axes, as torch.export Dims: the images' batch axis."""
        return {"images": {0: torch.export.Dim("batch", min=1, max=4096)}}

    def export_net(self) -> torch.nn.Module:
        """The module an export writes: it takes the inputs of `export_inputs` positionally, in their order."""
        return self

    # /part

    # --- the shared machinery ---

    def setup(self, stage: str) -> None:
        # What the classes are called, for a task with `num_classes` and `class_names` arguments: the
        # datamodule says once it is set up, and every checkpoint keeps it.
        datamodule = self.trainer.datamodule
        if datamodule is None:
            return
        # part: predict
        # How inference turns an input file into the net's input, with the datamodule's class, which an error
        # can then name. A datamodule without the method (any LightningDataModule) is recorded as one that does
        # not know: input files are then refused, not guessed.
        known = getattr(datamodule, "inference_preprocessing", lambda: None)()
        owner = f"{type(datamodule).__module__}.{type(datamodule).__qualname__}"
        self.hparams.preprocessing = {"datamodule": owner, **(known or {"transform": None})}
        # /part
        if "class_names" in self.hparams and "num_classes" in self.hparams:
            names = datamodule.hparams.get("class_names")
            self.hparams.class_names = names_or_indices(names, self.hparams.num_classes)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A net compiled with torch.compile(net) by other code saves its weights under `_orig_mod.`; this
        # module compiles in place (configure_model), so drop the prefix and either kind loads.
        state = checkpoint.get("state_dict", {})
        for name in [name for name in state if "_orig_mod." in name]:
            state[name.replace("_orig_mod.", "")] = state.pop(name)

    def configure_model(self) -> None:
        # Compiled in place (nn.Module.compile), in every process once the strategy has set up: the
        # parameter names stay those of the plain net (no `_orig_mod.` prefix), so checkpoints of compiled
        # and plain runs load into each other.
        if self.hparams.get("channels_last"):
            self.net.to(memory_format=torch.channels_last)
        if self.hparams.compile:
            self.net.compile()

    def forward(self, x: Tensor) -> Tensor:
        if self.hparams.get("channels_last") and x.dim() == 4:
            # the layout channels-last convs run fastest on
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    # Steps only update the metrics' states (on the device, no host sync); each epoch's values are computed
    # and logged once, at its end: logging a Metric object every step costs Lightning a fixed overhead per call
    # that shows on small models (the template's benchmark measured it).

    def _step(self, stage: str, batch: Any) -> dict[str, Tensor]:
        """The batch's loss, predictions and targets (callbacks draw the latter), once `stage`'s metrics took them."""
        loss, preds, targets = self.step(batch)
        metrics = getattr(self, f"{stage}_metrics")
        metrics["loss"].update(loss.detach())
        for name, metric in metrics.items():
            if name != "loss":
                metric.update(preds, targets)
        return {"loss": loss, "preds": preds, "targets": targets}

    def metric_values(self, prefix: str, metrics: Mapping[str, Metric]) -> dict[str, Tensor]:
        """The metrics' values by logged name: `<prefix>/<name>`, and `<prefix>/<name>_<class name>` for each
        class of a metric with one value per class (a stage's, or predict's)."""
        values = {}
        for name, metric in metrics.items():
            value = metric.compute()
            if value.dim() == 0:
                values[f"{prefix}/{name}"] = value
                continue
            labels = names_or_indices(self.label_names(), len(value))
            values |= {
                f"{prefix}/{name}_{label}": per_class for label, per_class in zip(labels, value, strict=True)
            }
        return values

    def _log_stage(self, stage: str) -> dict[str, Tensor]:
        """Log the epoch's values of `stage`, return them by logged name, and start the next epoch's afresh."""
        metrics = getattr(self, f"{stage}_metrics")
        values = self.metric_values(stage, metrics)
        # compute() synced the metric states across ranks, so every rank holds the global value already;
        # sync_dist averages those equal values (one small all-reduce per epoch) and keeps Lightning from
        # warning that epoch-level values are not synced. Values per class stay off the progress bar.
        for name, value in values.items():
            bar = stage != "test" and name.removeprefix(f"{stage}/") in metrics
            self.log(name, value, prog_bar=bar, sync_dist=True)
        metrics.reset()
        return values

    def on_train_epoch_start(self) -> None:
        # A new epoch's means start empty, also after a resume from the end of an epoch. (Lightning skips this
        # hook when it resumes in the middle of one, where the checkpointed states hold its first part.)
        self.train_metrics.reset()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._step("train", batch)["loss"]  # the loss alone: Lightning handles less per step

    def on_train_epoch_end(self) -> None:
        self._log_stage("train")

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        return self._step("val", batch)

    def on_validation_epoch_end(self) -> None:
        logged = self._log_stage("val")
        monitor = self.hparams.monitor
        # The sanity check's two batches do not count towards the best; a monitor logged elsewhere (by a
        # callback, or in training) has no best here.
        if self.trainer.sanity_checking or monitor not in logged:
            return
        self.monitor_best(logged[monitor])
        self.log(f"{monitor}_best", self.monitor_best.compute(), prog_bar=True, sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        return self._step("test", batch)

    def on_test_epoch_end(self) -> None:
        self._log_stage("test")

    # part: pretrained
    def configure_callbacks(self) -> list[L.Callback]:
        epochs = self.hparams.get("freeze_backbone_epochs", 0)
        return [finetuning.FrozenBackbone(epochs)] if epochs else []

    # /part

    def on_train_start(self) -> None:
        load_pending_loader_states(self.trainer)  # a workaround of a Lightning bug: src/compat/lightning.py

    def configure_optimizers(self) -> dict[str, Any]:
        parameters = self.trainer.model.parameters()
        parameters = finetuning.parameter_groups(self) or parameters  # [part: pretrained]
        optimizer = hydra.utils.instantiate(self.hparams.optimizer)(params=parameters)
        finetuning.scale_rates(optimizer)  # [part: pretrained]
        if self.hparams.scheduler is None:
            return {"optimizer": optimizer}
        scheduler_config = dict(self.hparams.scheduler)
        if "total_steps" in scheduler_config and scheduler_config["total_steps"] is None:
            scheduler_config["total_steps"] = self.trainer.estimated_stepping_batches  # the whole run's
        scheduler = hydra.utils.instantiate(scheduler_config)(optimizer=optimizer)
        stepping = {
            key: value for key, value in (self.hparams.scheduler_config or {}).items() if value is not None
        }
        stepping.setdefault("interval", getattr(scheduler, "interval", "epoch"))  # the scheduler's own
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, **stepping}}
