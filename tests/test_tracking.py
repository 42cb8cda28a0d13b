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
from tests.conftest import ROOT, last_metrics, only_run_dir, run_cli

DIGITS_MLP = ["data=digits", "model/net=mlp", "trainer.max_epochs=2"]
MANY_LOGGERS = [*DIGITS_MLP, "logger=many_loggers"]
# part: diagnostics
MANY_LOGGERS += [  # the pictures and histograms on
    "callbacks=[default,prediction_pictures,histograms]",
    "callbacks.histograms.log=all",
    "callbacks.histograms.every_n_steps=10",
]
# /part
METRICS = {"train/loss", "train/acc", "val/loss", "val/acc", "val/acc_best", "test/acc", "test/loss"}


def wandb_records(run_file: Path) -> list:
    """The records of an offline wandb run (`run-<id>.wandb`), as wandb's own protobuf messages.

    The file is a LevelDB-style log after a 7-byte header: 32 KiB blocks of chunks, each with a
    4-byte checksum, a 2-byte length and a type (1 whole record, 2 first, 3 middle, 4 last part).
    """
    import struct

    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", f"{run_file} is not a wandb run file"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_run(run_dir: Path) -> dict:
    """The one offline wandb run under `run_dir`: its run record, config (key -> value), history rows and
    the files it saved (paths relative to its files/ folder)."""
    import json

    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    run, config, history, files = None, {}, [], []
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "config":
            config |= {item.key: json.loads(item.value_json) for item in record.config.update}
        elif kind == "history":
            history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
        elif kind == "files":
            files += [file.path for file in record.files.files]
    return {"run": run, "config": config, "history": history, "files": files, "dir": run_file.parent}


@pytest.fixture(scope="module")
def many_loggers_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """One run logging to CSV, TensorBoard and wandb; a command, as wandb leaves its service behind."""
    log_dir = tmp_path_factory.mktemp("logs")
    result = run_cli("train", *MANY_LOGGERS, log_dir=log_dir, data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run_dir(log_dir)


@pytest.mark.slow  # many_loggers_run is a command
def test_wandb_gets_a_recognisable_name_the_resolved_config_and_the_metrics(many_loggers_run: Path):
    wandb = wandb_run(many_loggers_run)
    # The job's overrides in order, without where files go (paths.*) and the tests' own settings.
    assert wandb["run"].display_name == ",".join(sorted(MANY_LOGGERS))
    assert wandb["run"].job_type == "train" and wandb["run"].run_group == ""  # a single run has no group
    config = wandb["config"]
    assert config["model"]["net"]["hidden_sizes"] == [256, 128]  # nested, not "model/net/hidden_sizes"
    assert config["model"]["net"]["input_shape"] == [1, 8, 8]  # resolved, not "${data.input_shape}"
    assert config["trainer"]["max_epochs"] == 2 and config["model/params/total"] > 0
    assert config["run"]["git"]["commit"] == git_state(ROOT)["commit"]  # the run record came along
    assert {key for row in wandb["history"] for key in row} >= METRICS
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


@pytest.mark.slow  # many_loggers_run is a command
def test_tensorboard_event_files_hold_what_the_run_logged(many_loggers_run: Path):
    (events_dir,) = {p.parent for p in (many_loggers_run / "tensorboard").glob("**/events.out.tfevents.*")}
    events = EventAccumulator(str(events_dir), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    tags = events.Tags()
    assert {"train/loss", "val/acc", "test/acc"} <= set(tags["scalars"])
    assert events.Scalars("test/acc")[-1].value == pytest.approx(last_metrics(many_loggers_run)["test/acc"])
    # part: diagnostics
    pictures = {"val/confusion_matrix", "val/predictions", "test/confusion_matrix", "test/predictions"}
    assert pictures <= set(tags["images"]) and len(events.Images("val/confusion_matrix")) == 2  # per epoch
    assert {"gradients/net.layers.1.weight", "parameters/net.layers.1.weight"} <= set(tags["histograms"])
    # /part


@pytest.mark.slow  # many_loggers_run is a command
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
    # part: diagnostics
    pictures = many_loggers_run / "pictures"  # the test pictures as files too
    assert sorted(p.name for p in pictures.iterdir()) == ["test_confusion_matrix.png", "test_predictions.png"]
    # /part


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
def test_wandb_online_without_a_login_fails_at_start_and_the_record_says_so(tmp_path: Path, data_dir: Path):
    # A user who never ran `wandb login`: a home of their own with no key in it, nothing in the environment.
    env = {name: None for name in os.environ if name.startswith("WANDB_")} | {"HOME": str(tmp_path / "home")}
    overrides = ["debug=limit", *DIGITS_MLP, "logger=wandb"]
    result = run_cli("train", *overrides, log_dir=tmp_path, data_dir=data_dir, env=env)
    assert result.returncode != 0 and "wandb login" in result.stderr  # what the user reads
    record = json.loads((only_run_dir(tmp_path, "debug") / "run.json").read_text())
    assert record["status"] == "failed" and "API key" in record["error"]  # not "completed"
