"""One place says which metric a run watches and which way is better, the top-level `monitor` and `mode`: the
best checkpoint, early stopping, the running best, a sweep job's value and the summary's order follow them.
An Optuna study's direction too (tests/test_optuna.py runs its study with mode=min).  [part: optuna]
"""

import csv
import json
from pathlib import Path

import pytest
import torch

from hydra_plugins.sweep_summary.summary import write_summary
from src import api
from src.models.classifier_module import ClassifierModule
from tests.conftest import run_cli
from tests.test_sweeps import read_summary

WATCH_LOSS = ["monitor=val/loss", "mode=min"]
WATCHED = "{'monitor': 'val/loss', 'mode': 'min'"  # how a callback's state key names them


def logged(job_dir: Path, name: str) -> list[float]:
    """Every value of one metric in a job's CSV log, in order."""
    with open(job_dir / "csv" / "version_0" / "metrics.csv") as file:
        return [float(row[name]) for row in csv.DictReader(file) if row.get(name)]


@pytest.mark.slow
def test_one_override_of_the_watched_metric_changes_every_consumer(tmp_path: Path, data_dir: Path):
    # A sweep (-m): the jobs return their best value and the summary orders them. Job 0's learning rate is the
    # worse one: listed first, it must move down for the summary to be by loss.
    overrides = [*WATCH_LOSS, "trainer.max_epochs=3", "model.optimizer.lr=0.3,0.001"]
    result = run_cli(
        "train", "-m", "data=digits", "model/net=mlp", *overrides, log_dir=tmp_path, data_dir=data_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    best = {}
    for job in ("0", "1"):
        losses = logged(sweep / job, "val/loss")
        best[job] = lowest = min(losses)
        callbacks = torch.load(sweep / job / "checkpoints" / "best.ckpt", weights_only=True)["callbacks"]
        watching = {key.split("{")[0]: state for key, state in callbacks.items() if WATCHED in key}
        assert watching["ModelCheckpoint"]["best_model_score"].item() == pytest.approx(lowest)
        assert watching["EarlyStopping"]["best_score"].item() == pytest.approx(lowest)
        # The model's running best is the lowest loss so far, epoch by epoch (3 of them), and the job returns it.
        assert logged(sweep / job, "val/loss_best") == pytest.approx([min(losses[:i]) for i in (1, 2, 3)])
        returned = json.loads((sweep / job / "result.json").read_text())
        assert (returned["metric"], returned["value"]) == ("val/loss_best", pytest.approx(lowest))

    assert best["0"] > best["1"]  # else the summary's order below would not tell min from max
    rows = read_summary(sweep)
    assert [row["job"] for row in rows] == ["1", "0"]  # the lower loss first
    assert [float(row["val/loss_best"]) for row in rows] == pytest.approx([best["1"], best["0"]])


def test_by_default_everything_watches_val_acc_and_maximizes(compose_cfg):
    cfg = compose_cfg("train")
    assert (cfg.monitor, cfg.mode, cfg.optimized_metric) == ("val/acc", "max", "val/acc_best")
    for consumer in (cfg.callbacks.model_checkpoint, cfg.callbacks.early_stopping, cfg.model):
        assert (consumer.monitor, consumer.mode) == ("val/acc", "max")
    assert api.compose("train").hydra.callbacks.sweep_summary.mode == "max"
    # part: optuna
    search = api.compose("train", ["hparams_search=digits_mlp"])
    assert search.hydra.sweeper.mode == "max" and search.hydra.callbacks.sweep_summary.mode == "max"
    assert search.callbacks.optuna_pruning.monitor == "val/acc_best"
    # /part
    # part: predict
    predict = api.compose("predict")  # like export, no `mode`: the hydra config falls back to max
    assert "mode" not in predict and predict.hydra.callbacks.sweep_summary.mode == "max"
    # /part


def test_a_bad_mode_is_refused_in_one_line_naming_the_valid_ones(tmp_path: Path):
    message = r"^mode=maxx is not valid; choose max or min$"
    with pytest.raises(ValueError, match=message):
        ClassifierModule(net={}, optimizer={}, num_classes=10, mode="maxx")
    with pytest.raises(ValueError, match=message):
        write_summary(tmp_path, mode="maxx")
