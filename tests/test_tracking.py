"""Experiment tracking: wandb offline, TensorBoard, CSV together; the run record.
And the pictures and histograms the diagnostic callbacks log there.  [part: diagnostics]
MLflow: tests/test_mlflow.py.  [part: mlflow]
Each logger is read back from what it wrote, as its own viewer would read it.
"""

import json
import os
from datetime import datetime
from pathlib import Path

import pytest
import torch
from PIL import Image  # [part: diagnostics]
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from src.run.builder import build
from src.run.record import git_state
from tests.conftest import (
    ROOT,
    last_metrics,
    only_run_dir,
    run_cli,
    wandb_records,
    wandb_run,
)

DIGITS_MLP = ["data=digits", "model/net=mlp", "trainer.max_epochs=2"]
# One real training run with CSV, TensorBoard and wandb (offline) at once.
MANY_LOGGERS = [*DIGITS_MLP, "logger=many_loggers"]
# part: diagnostics
MANY_LOGGERS += [  # the pictures and histograms on
    "callbacks=[default,prediction_pictures,histograms]",
    "callbacks.histograms.log=all",
    "callbacks.histograms.every_n_steps=10",
]
# /part


@pytest.fixture(scope="module")
def many_loggers_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """One real training run with CSV, TensorBoard and wandb (offline) at once.
    The pictures and histograms on.  [part: diagnostics]
    On the command line: wandb would leave its service process and WANDB_MODE/WANDB_SERVICE in this process's
    environment, which every later command of the tests inherits."""
    log_dir = tmp_path_factory.mktemp("logs")
    result = run_cli("train", *MANY_LOGGERS, log_dir=log_dir, data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run_dir(log_dir)


def test_wandb_gets_the_nested_resolved_config_and_a_recognisable_name(many_loggers_run: Path):
    wandb = wandb_run(many_loggers_run)
    # The job's overrides in order, without where files go (paths.*) and the tests' own settings.
    assert wandb["run"].display_name == ",".join(sorted(MANY_LOGGERS))
    assert wandb["run"].job_type == "train" and wandb["run"].run_group == ""  # a single run has no group
    config = wandb["config"]
    assert config["model"]["net"]["hidden_sizes"] == [256, 128]  # nested, not "model/net/hidden_sizes"
    assert config["model"]["net"]["input_shape"] == [1, 8, 8]  # resolved, not "${data.input_shape}"
    assert config["trainer"]["max_epochs"] == 2 and config["model/params/total"] > 0
    assert config["run"]["git"]["commit"] == git_state(ROOT)["commit"]  # the run record came along


def test_wandb_gets_train_val_and_test_metrics_and_the_pictures(many_loggers_run: Path):
    wandb = wandb_run(many_loggers_run)
    logged = {key for row in wandb["history"] for key in row}
    assert {
        "train/loss",
        "train/acc",
        "val/loss",
        "val/acc",
        "val/acc_best",
        "test/acc",
        "test/loss",
    } <= logged
    test_acc = next(row["test/acc"] for row in wandb["history"] if "test/acc" in row)
    assert test_acc == pytest.approx(last_metrics(many_loggers_run)["test/acc"])
    # part: diagnostics
    for picture in ("val/confusion_matrix", "test/confusion_matrix", "test/predictions"):
        (row,) = [row for row in wandb["history"] if f"{picture}/_type" in row][-1:]
        assert row[f"{picture}/_type"] == "images/separated"
        (name,) = row[f"{picture}/filenames"]
        assert name in wandb["files"]
        image = Image.open(wandb["dir"] / "files" / name)
        assert image.format == "PNG" and min(image.size) > 300
    assert any(row.get("gradients/net.layers.1.weight/_type") == "histogram" for row in wandb["history"])
    # /part


def test_tensorboard_event_files_hold_what_the_run_logged(many_loggers_run: Path):
    (events_dir,) = {p.parent for p in (many_loggers_run / "tensorboard").glob("**/events.out.tfevents.*")}
    events = EventAccumulator(str(events_dir), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    tags = events.Tags()
    assert {"train/loss", "val/acc", "test/acc"} <= set(tags["scalars"])
    assert events.Scalars("test/acc")[-1].value == pytest.approx(last_metrics(many_loggers_run)["test/acc"])
    # part: diagnostics
    assert {"val/confusion_matrix", "val/predictions", "test/confusion_matrix", "test/predictions"} <= set(
        tags["images"]
    )
    assert len(events.Images("val/confusion_matrix")) == 2  # one per epoch
    assert (
        "gradients/net.layers.1.weight" in tags["histograms"]
        and "parameters/net.layers.1.weight" in tags["histograms"]
    )
    # /part


def test_the_run_record_says_what_ran_from_which_code_and_how_it_ended(many_loggers_run: Path):
    record = json.loads((many_loggers_run / "run.json").read_text())
    git = git_state(ROOT)
    assert record["git"]["commit"] == git["commit"] and record["git"]["dirty"] == git["dirty"]
    if git["dirty"]:  # the uncommitted changes are kept beside the record
        assert (many_loggers_run / record["git"]["diff_file"]).read_text() == git["diff"]
    assert torch.__version__.startswith(record["versions"]["torch"])
    assert {"python", "lightning", "hydra-core", "cuda"} <= set(record["versions"])
    assert "train.py" in record["command"] and "model/net=mlp" in record["overrides"]["task"]
    assert record["world_size"] == 1 and record["seed"] == 42 and record["host"]["hostname"]
    assert record["status"] == "completed" and record["error"] is None
    assert datetime.fromisoformat(record["start_time"]) <= datetime.fromisoformat(record["end_time"])
    assert record["final_metrics"]["test/acc"] == pytest.approx(last_metrics(many_loggers_run)["test/acc"])
    assert record["config"]["model"]["net"]["hidden_sizes"] == [256, 128]
    # part: diagnostics
    pictures = many_loggers_run / "pictures"  # the test pictures as files too
    assert sorted(p.name for p in pictures.iterdir()) == ["test_confusion_matrix.png", "test_predictions.png"]
    # /part


def test_git_fields_are_null_outside_a_git_repository(tmp_path: Path):
    assert git_state(tmp_path) == {"commit": None, "branch": None, "dirty": None, "diff": None}


def test_a_run_outside_git_that_fails_still_completes_its_record(compose_cfg, tmp_path: Path):
    cfg = compose_cfg("train", [*DIGITS_MLP, f"paths.root_dir={tmp_path}"])
    with pytest.raises(RuntimeError, match="out of memory, say"), build(cfg) as run:
        run.metrics = {"val/acc": 0.5}
        raise RuntimeError("out of memory, say")
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["git"] == {"commit": None, "branch": None, "dirty": None, "diff_file": None}
    assert record["status"] == "failed" and record["error"] == "RuntimeError: out of memory, say"
    assert record["final_metrics"] == {"val/acc": 0.5} and record["duration_s"] >= 0


@pytest.mark.slow
def test_wandb_offline_from_the_environment_alone_never_prompts(tmp_path: Path, data_dir: Path):
    # The config's other documented way: logger.wandb.offline stays false, WANDB_MODE=offline is enough.
    result = run_cli(
        "train",
        "debug=limit",
        "data=digits",
        "model/net=mlp",
        "logger=wandb",
        log_dir=tmp_path,
        data_dir=data_dir,
        env={"WANDB_MODE": "offline"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert wandb_run(only_run_dir(tmp_path, "debug"))["run"] is not None


@pytest.mark.slow
def test_wandb_online_without_a_login_fails_at_start_and_the_record_says_so(tmp_path: Path, data_dir: Path):
    # A user who never ran `wandb login`: a home of their own with no key in it, nothing in the environment.
    env = {name: None for name in os.environ if name.startswith("WANDB_")} | {"HOME": str(tmp_path / "home")}
    result = run_cli(
        "train", "debug=limit", *DIGITS_MLP, "logger=wandb", log_dir=tmp_path, data_dir=data_dir, env=env
    )
    assert result.returncode != 0 and "wandb login" in result.stderr
    record = json.loads((only_run_dir(tmp_path, "debug") / "run.json").read_text())
    assert record["status"] == "failed" and "API key" in record["error"]  # not "completed"


@pytest.mark.slow
def test_ddp_creates_one_wandb_run_from_rank_zero_with_its_checkpoints(tmp_path: Path, data_dir: Path):
    overrides = ["trainer=ddp_sim", *DIGITS_MLP, "logger=wandb", "logger.wandb.log_model=all"]
    overrides += ["callbacks=[default,prediction_pictures]"]  # drawn on rank 0 only  [part: diagnostics]
    # Lightning refuses log_model with logger.wandb.offline=true; offline checkpoints need WANDB_MODE=offline.
    result = run_cli("train", *overrides, log_dir=tmp_path, data_dir=data_dir, env={"WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 1
    wandb = wandb_run(run_dir)
    assert wandb["config"]["run"]["world_size"] == 2
    assert json.loads((run_dir / "run.json").read_text())["world_size"] == 2
    assert any("test/confusion_matrix/_type" in row for row in wandb["history"])  # once  [part: diagnostics]
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    artifacts = [r.artifact for r in wandb_records(run_file) if r.WhichOneof("record_type") == "artifact"]
    assert artifacts and all(a.type == "model" for a in artifacts)  # log_model=all: checkpoints as artifacts


def test_the_csv_logger_keeps_the_columns_another_copy_of_it_wrote(tmp_path: Path):
    """Under ddp_spawn the fit and the test stages each get a copy of the logger made before either wrote;
    the test stage used to rewrite metrics.csv with its own columns only, and failed."""
    import csv
    import pickle

    from src.run.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="csv", version=0)
    logger.experiment  # noqa: B018 - made in the main process, before the workers start
    copy = pickle.dumps(logger)
    logger.log_metrics({"train/loss": 1.0}, step=0)
    logger.save()  # the fit's worker
    test_stage = pickle.loads(copy)
    test_stage.log_metrics({"test/acc": 0.5}, step=1)
    test_stage.save()
    with open(tmp_path / "csv" / "version_0" / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [(row["train/loss"], row["test/acc"]) for row in rows] == [("1.0", ""), ("", "0.5")]
