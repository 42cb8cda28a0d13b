"""A generic image classifier: any `net` from config, cross-entropy loss, accuracy tracked per stage."""

from typing import Any

import hydra
import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from torchmetrics import MaxMetric, MeanMetric, MinMetric
from torchmetrics.classification import MulticlassAccuracy

from src.data.components.labels import names_or_indices


def _plain(config: Any) -> Any:
    """A config as plain dicts and lists, so checkpoints hold only data that `weights_only=True` loads."""
    if isinstance(config, DictConfig) or OmegaConf.is_config(config):
        return OmegaConf.to_container(config, resolve=True)
    return config


class ClassifierModule(L.LightningModule):
    """Classification LightningModule whose net, optimizer and scheduler are Hydra configs.

    The module instantiates them itself and saves only their configs as hyperparameters: a checkpoint then
    holds plain data (no pickled modules or partials), loads with `weights_only=True`, and
    `ClassifierModule.load_from_checkpoint(path)` rebuilds the same net.
    """

    def __init__(
        self,
        net: dict,
        optimizer: dict,
        num_classes: int,
        scheduler: dict | None = None,
        scheduler_config: dict | None = None,
        compile: bool = False,
        channels_last: bool = False,
        class_names: list[str] | None = None,
        preprocessing: dict | None = None,
        monitor: str = "val/acc",
        mode: str = "max",
    ) -> None:
        """`monitor` and `mode`: the validation metric whose best value so far is logged as `<monitor>_best`,
        and which way it is better (max or min).

        `class_names` and `preprocessing` need not be given: they are taken from the datamodule when
        training starts and saved with every checkpoint, so that predict and export need nothing else."""
        if mode not in ("max", "min"):
            raise ValueError(f"mode={mode} is not valid; choose max or min")
        super().__init__()
        self.save_hyperparameters(
            {
                "net": _plain(net),
                "optimizer": _plain(optimizer),
                "num_classes": num_classes,
                "scheduler": _plain(scheduler),
                "scheduler_config": _plain(scheduler_config),
                "compile": compile,
                "channels_last": channels_last,
                "class_names": _plain(class_names),
                "preprocessing": _plain(preprocessing),
                "monitor": monitor,
                "mode": mode,
            },
            logger=False,  # the builder logs the whole resolved run config instead
        )
        self.net = hydra.utils.instantiate(self.hparams.net)
        # One metric object per stage: torchmetrics keeps their states apart and syncs them across ranks.
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.test_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        # No NaN check on the loss means: it would read the value back to the host every step (a GPU sync);
        # the training_guards callback stops on a NaN loss instead, and a NaN mean stays visible.
        self.train_loss, self.val_loss, self.test_loss = (
            MeanMetric(nan_strategy="disable") for _ in range(3)
        )
        self.monitor_best = MaxMetric() if mode == "max" else MinMetric()
        # Metric states go into checkpoints: a run resumed mid-epoch (or after its best epoch) reports the
        # same epoch means and best value as an uninterrupted one.
        for metric in (self.train_acc, self.train_loss, self.monitor_best):
            metric.persistent(True)

    def setup(self, stage: str) -> None:
        # What inference needs to know about the data: how to turn an image file into the net's input,
        # and what the classes are called. The datamodule set up first; its answer goes into checkpoints,
        # with the datamodule's class, which an error can then name. A datamodule without the method (any
        # LightningDataModule) is recorded as one that does not know: image files are refused, not guessed.
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is not None:
            known = getattr(datamodule, "inference_preprocessing", lambda: None)()
            owner = f"{type(datamodule).__module__}.{type(datamodule).__qualname__}"
            self.hparams.preprocessing = {"datamodule": owner, **(known or {"transform": None})}
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
            x = x.contiguous(
                memory_format=torch.channels_last
            )  # the layout the converted convs run fastest on
        return self.net(x)

    def _shared_step(self, batch: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
        x, y = batch[0], batch[1]  # data.collate=pad adds the images' original sizes as a third item
        logits = self(x)
        return F.cross_entropy(logits, y), logits.argmax(dim=1), y

    # Steps only update the metrics' states (on the device, no host sync); each epoch's means are computed
    # and logged once, at its end: logging a Metric object every step costs Lightning a fixed overhead per call
    # that shows on small models (figures: README, "Performance").

    def on_train_epoch_start(self) -> None:
        # A new epoch's means start empty. (Lightning skips this hook when it resumes in the middle of an
        # epoch, where the checkpointed states hold that epoch's first part.)
        self.train_loss.reset()
        self.train_acc.reset()

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        loss, preds, targets = self._shared_step(batch)
        self.train_loss.update(loss.detach())
        self.train_acc.update(preds, targets)
        return loss

    def _log_epoch(self, name: str, value: Tensor, prog_bar: bool = True) -> None:
        # compute() synced the metric states across ranks, so every rank holds the global value already;
        # sync_dist averages those equal values (one small all-reduce per epoch) and keeps Lightning from
        # warning that epoch-level values are not synced.
        self.log(name, value, prog_bar=prog_bar, sync_dist=True)

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train/loss", self.train_loss.compute())
        self._log_epoch("train/acc", self.train_acc.compute())

    def on_validation_epoch_start(self) -> None:
        self.val_loss.reset()
        self.val_acc.reset()

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> dict[str, Tensor]:
        loss, preds, targets = self._shared_step(batch)
        self.val_loss.update(loss)
        self.val_acc.update(preds, targets)
        return {"preds": preds, "targets": targets}  # for callbacks (prediction pictures)

    def on_validation_epoch_end(self) -> None:
        logged = {"val/loss": self.val_loss.compute(), "val/acc": self.val_acc.compute()}
        for name, value in logged.items():
            self._log_epoch(name, value)
        monitor = self.hparams.monitor
        # The sanity check's two batches do not count towards the best; a monitor logged elsewhere (by a
        # callback, or in training) has no best here.
        if self.trainer.sanity_checking or monitor not in logged:
            return
        self.monitor_best(logged[monitor])
        self._log_epoch(f"{monitor}_best", self.monitor_best.compute())

    def on_test_epoch_start(self) -> None:
        self.test_loss.reset()
        self.test_acc.reset()

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> dict[str, Tensor]:
        loss, preds, targets = self._shared_step(batch)
        self.test_loss.update(loss)
        self.test_acc.update(preds, targets)
        return {"preds": preds, "targets": targets}

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test/loss", self.test_loss.compute(), prog_bar=False)
        self._log_epoch("test/acc", self.test_acc.compute(), prog_bar=False)

    def predict_step(self, batch: Tensor | tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x = batch[0] if isinstance(batch, list | tuple) else batch
        return torch.softmax(self(x), dim=1)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = hydra.utils.instantiate(self.hparams.optimizer)(params=self.trainer.model.parameters())
        if self.hparams.scheduler is None:
            return {"optimizer": optimizer}
        scheduler = hydra.utils.instantiate(self.hparams.scheduler)(optimizer=optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, **(self.hparams.scheduler_config or {})},
        }
