"""One place says which metric a run watches and which way is better: the top-level `monitor` and `mode`.

The best checkpoint, early stopping, the model's running best (`<monitor>_best`), the value a sweep job
returns and the sweep summary's order all follow them.
An Optuna study's direction too.  [part: optuna]
"""

import csv
import json
from pathlib import Path

import optuna  # [part: optuna]
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig
from optuna.study import StudyDirection  # [part: optuna]

from hydra_plugins.sweep_summary.summary import write_summary
from src.models.classifier_module import ClassifierModule
from tests.conftest import CONFIG_DIR, run_cli

DIGITS_MLP = ["data=digits", "model/net=mlp"]
WATCH_LOSS = ["monitor=val/loss", "mode=min"]


def logged(job_dir: Path, name: str) -> list[float]:
    """Every value of one metric in a job's CSV log, in order."""
    with open(job_dir / "csv" / "version_0" / "metrics.csv") as file:
        return [float(row[name]) for row in csv.DictReader(file) if row.get(name)]


def read_summary(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "summary.csv") as file:
        return list(csv.DictReader(file))


def callback_state(checkpoint: dict, kind: str) -> tuple[str, dict]:
    """The state key (which names monitor and mode) and the state of the one `kind` callback in a checkpoint."""
    ((key, state),) = [(k, v) for k, v in checkpoint["callbacks"].items() if k.startswith(kind + "{")]
    return key, state


def test_one_override_of_the_watched_metric_changes_every_consumer(tmp_path: Path, data_dir: Path):
    # Job 0's learning rate is the worse one: listed first, it must move down for the summary to be by loss.
    overrides = [*DIGITS_MLP, *WATCH_LOSS, "trainer.max_epochs=3", "model.optimizer.lr=0.3,0.001"]
    result = run_cli("train", "-m", *overrides, log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()

    best = {}
    for job in ("0", "1"):
        job_dir = sweep / job
        losses = logged(job_dir, "val/loss")
        assert len(losses) == 3
        lowest = min(losses)
        checkpoint = torch.load(job_dir / "checkpoints" / "best.ckpt", weights_only=True)
        key, state = callback_state(checkpoint, "ModelCheckpoint")
        assert "'monitor': 'val/loss', 'mode': 'min'" in key
        assert state["best_model_score"].item() == pytest.approx(lowest)
        key, state = callback_state(checkpoint, "EarlyStopping")
        assert key == "EarlyStopping{'monitor': 'val/loss', 'mode': 'min'}"
        assert state["best_score"].item() == pytest.approx(lowest)
        # The model's running best is the lowest loss so far, epoch by epoch, and is what the job returns.
        running = [min(losses[: i + 1]) for i in range(len(losses))]
        assert logged(job_dir, "val/loss_best") == pytest.approx(running)
        returned = json.loads((job_dir / "result.json").read_text())
        assert returned["metric"] == "val/loss_best"
        assert returned["value"] == pytest.approx(lowest)
        best[job] = lowest

    assert best["0"] > best["1"]  # else the summary's order below would not tell min from max
    rows = read_summary(sweep)
    assert [row["job"] for row in rows] == ["1", "0"]  # the lower loss first
    assert [float(row["val/loss_best"]) for row in rows] == pytest.approx([best["1"], best["0"]])


# part: optuna
@pytest.mark.slow
def test_an_optuna_study_minimizes_when_the_mode_is_min(tmp_path: Path, data_dir: Path):
    overrides = [*WATCH_LOSS, "hydra.sweeper.n_trials=2", "trainer.max_epochs=1"]
    result = run_cli(
        "train", "-m", "hparams_search=digits_mlp", *overrides, log_dir=tmp_path, data_dir=data_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    study_dir = tmp_path / "train" / "studies" / "digits_mlp"
    study = optuna.load_study(study_name="digits_mlp", storage=f"sqlite:///{study_dir}/optuna.db")
    assert study.direction == StudyDirection.MINIMIZE
    for trial in study.trials:  # each trial returned, and reported to the pruner, its lowest val/loss
        lowest = min(logged(study_dir / str(trial.number), "val/loss"))
        assert trial.value == pytest.approx(lowest)
        assert trial.intermediate_values == {0: pytest.approx(lowest)}
    values = [float(row["val/loss_best"]) for row in read_summary(study_dir)]
    assert values == sorted(values)  # best (lowest) first
    assert int(read_summary(study_dir)[0]["job"]) == study.best_trial.number


# /part


# --- without overrides, and refused values: no training ---


def test_by_default_everything_watches_val_acc_and_maximizes(tmp_path: Path, data_dir: Path):
    shown = run_cli("train", "--cfg", "job", "--resolve", log_dir=tmp_path, data_dir=data_dir)
    assert shown.returncode == 0, shown.stderr[-3000:]
    cfg = yaml.safe_load(shown.stdout)
    assert (cfg["monitor"], cfg["mode"], cfg["optimized_metric"]) == ("val/acc", "max", "val/acc_best")
    for consumer in (cfg["callbacks"]["model_checkpoint"], cfg["callbacks"]["early_stopping"], cfg["model"]):
        assert (consumer["monitor"], consumer["mode"]) == ("val/acc", "max")

    assert composed("train").hydra.callbacks.sweep_summary.mode == "max"
    # part: optuna
    search = composed("train", ["hparams_search=digits_mlp"])
    assert search.hydra.sweeper.mode == "max" and search.hydra.callbacks.sweep_summary.mode == "max"
    assert search.callbacks.optuna_pruning.monitor == "val/acc_best"
    # /part
    # part: predict
    predict = composed("predict")  # predict (like export) has no `mode`: the hydra config falls back to max
    assert "mode" not in predict and predict.hydra.callbacks.sweep_summary.mode == "max"
    # /part


def composed(name: str, overrides: list[str] | None = None) -> DictConfig:
    """`name`'s config with Hydra's own (hydra.sweeper, hydra.callbacks), as a run composes it."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(name, overrides or [], return_hydra_config=True)
    GlobalHydra.instance().clear()
    return cfg


def test_a_bad_mode_is_refused_in_one_line_naming_the_valid_ones(tmp_path: Path):
    message = r"^mode=maxx is not valid; choose max or min$"
    with pytest.raises(ValueError, match=message):
        ClassifierModule(net={}, optimizer={}, num_classes=10, mode="maxx")
    with pytest.raises(ValueError, match=message):
        write_summary(tmp_path, mode="maxx")
