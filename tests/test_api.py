"""src/api.py: the tasks from Python run as the command line runs them, and a trained run opens in Python.
A test of another feature that needs a run calls `api.train([*here, ...])` the same way."""

import json
import logging
import os
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from hydra.utils import instantiate
from nbclient import NotebookClient

from src import api
from tests.conftest import ROOT

DIGITS_MLP = ["data=digits", "model/net=mlp", "trainer.max_epochs=2"]


def test_train_from_python_records_the_command_lines_run(here: list[str], tmp_path: Path):
    run = api.train([*here, *DIGITS_MLP, "run_name=python"])
    record = json.loads((run.run_dir / "run.json").read_text())
    assert run.run_dir == tmp_path / "train" / "runs" / "python"
    assert record["status"] == "completed" and record["final_metrics"] == run.metrics
    python = Path(sys.executable).name
    assert record["command"] == f"{python} src/train.py {' '.join([*here, *DIGITS_MLP])} run_name=python"
    assert (run.run_dir / "train.log").is_file() and (run.run_dir / ".hydra" / "overrides.yaml").is_file()
    # The command line gives the same test metrics for the same overrides: the README's walk (test_train.py).


def test_runs_in_one_process_do_not_leak_into_each_other(here: list[str]):
    """The same metrics twice; no run leaves its variables (PL_GLOBAL_SEED) or log handlers to the next, and
    a failing run raises its error."""
    environment, handlers = dict(os.environ), list(logging.getLogger().handlers)
    first, second = (api.train([*here, *DIGITS_MLP, "seed=0"]) for _ in range(2))  # 0 is a seed too
    assert first.run_dir != second.run_dir and first.metrics == second.metrics
    with pytest.raises(ValueError, match=r"trainer.max_epochs='ten' is not valid"):
        api.train([*here, *DIGITS_MLP, "trainer.max_epochs=ten"])
    assert dict(os.environ) == environment and logging.getLogger().handlers == handlers


def test_a_trained_run_opens_with_its_model_data_and_config(digits_run: Path):
    trained = api.load_run(digits_run)
    record = json.loads((digits_run / "run.json").read_text())
    assert trained.checkpoint == digits_run / record["tested_checkpoint"]
    assert not trained.model.training and trained.config.model == record["config"]["model"]
    assert trained.class_names is None  # the digits' classes are their indices
    assert len(trained.datamodule.data_test) == 250  # set up on the run's splits (the notebook predicts)


def test_a_foreign_checkpoint_or_a_folder_without_a_run_record_is_refused(digits_run: Path, tmp_path: Path):
    cnn = instantiate(api.compose("train", ["data=digits", "model/net=simple_cnn"]).model)
    (checkpoint := tmp_path / "checkpoints" / "best.ckpt").parent.mkdir()
    torch.save({"state_dict": cnn.state_dict()}, checkpoint)
    with pytest.raises(ValueError, match=r"best.ckpt does not fit this model \(Missing key") as refused:
        api.load_run(digits_run, checkpoint=checkpoint)
    assert "\n" not in str(refused.value)  # one line
    with pytest.raises(FileNotFoundError, match=rf"run_dir={tmp_path} has no run.json"):
        api.load_run(tmp_path)


def test_compose_gives_the_config_a_run_would_get():
    cfg = api.compose("train", ["data=digits", "data.batch_size=32"])
    assert cfg.task_name == "train" and cfg.data.batch_size == 32
    assert Path(instantiate(cfg.data).hparams.data_dir) == ROOT / "data"  # its paths resolve as in a run


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom(here: list[str], tmp_path: Path):
    """notebooks/explore_a_run.ipynb in a real Jupyter kernel: train, open the run, predict, plot, evaluate."""
    notebook = nbformat.read(ROOT / "notebooks" / "explore_a_run.ipynb", as_version=4)
    (parameters,) = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    parameters.source += f"\nwhere = {here!r}"
    NotebookClient(notebook, timeout=120, resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    text = "".join(output.get("text", "") for output in outputs)
    accuracy, reported = text.split("test accuracy ")[1].split("\n")[0].split("; the run reported ")
    assert float(accuracy) == pytest.approx(float(reported), abs=1e-4)
    assert any("image/png" in output.get("data", {}) for output in outputs)  # the confusion matrix
    again, first = eval(outputs[-1]["data"]["text/plain"])  # the last cell: eval's test/acc and the run's
    assert again == pytest.approx(first)
