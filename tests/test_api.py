"""src/api.py: the tasks from Python run as the command line runs them, and a trained run opens in Python.
A test of another feature that needs a run calls `api.train([*here, ...])` the same way."""

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from hydra.utils import instantiate
from nbclient import NotebookClient

from src import api
from tests.conftest import ONE_BATCH, ROOT, cli_command, cli_env

DIGITS_MLP = ["data=digits", "model/net=mlp", "trainer.max_epochs=2"]


def test_train_from_python_is_the_command_lines_run(here: list[str], tmp_path: Path):
    run = api.train([*here, *DIGITS_MLP, "run_name=python"])
    record = json.loads((run.run_dir / "run.json").read_text())
    assert run.run_dir == tmp_path / "train" / "runs" / "python"
    assert record["status"] == "completed" and record["final_metrics"] == run.metrics
    assert (
        record["command"]
        == f"{Path(sys.executable).name} src/train.py {' '.join([*here, *DIGITS_MLP])} run_name=python"
    )
    assert (run.run_dir / "train.log").is_file() and (run.run_dir / ".hydra" / "overrides.yaml").is_file()

    # The same overrides on the command line give the same test metrics.
    command = cli_command(
        "train", *DIGITS_MLP, "run_name=cli", log_dir=tmp_path, data_dir=Path(here[1].partition("=")[2])
    )
    done = subprocess.run(command, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cli = json.loads((tmp_path / "train" / "runs" / "cli" / "run.json").read_text())["final_metrics"]
    assert {k: v for k, v in cli.items() if k.startswith("test/")} == {
        k: v for k, v in run.metrics.items() if k.startswith("test/")
    }


def test_training_twice_in_one_process_gives_the_same_metrics(here: list[str]):
    environment = dict(os.environ)
    first, second = (api.train([*here, *DIGITS_MLP, "seed=7"]) for _ in range(2))
    assert first.run_dir != second.run_dir
    assert first.metrics == second.metrics
    assert dict(os.environ) == environment  # no run leaves its variables (PL_GLOBAL_SEED) to the next


def test_a_failing_run_raises_its_error_and_leaves_logging_as_it_was(here: list[str]):
    import logging

    handlers = list(logging.getLogger().handlers)
    with pytest.raises(ValueError, match=r"trainer.max_epochs='ten' is not valid"):
        api.train([*here, *DIGITS_MLP, "trainer.max_epochs=ten"])
    assert logging.getLogger().handlers == handlers


def test_a_trained_run_opens_with_its_model_data_and_config(digits_run: Path):
    trained = api.load_run(digits_run)
    record = json.loads((digits_run / "run.json").read_text())
    assert trained.checkpoint == digits_run / record["tested_checkpoint"]
    assert not trained.model.training and trained.config.model == record["config"]["model"]
    assert trained.class_names is None  # the digits' classes are their indices

    # The model on the datamodule's test split gives the test accuracy the run reported.
    correct = 0
    with torch.no_grad():
        for batch in trained.datamodule.test_dataloader():
            _, predicted, target = trained.model.step(batch)
            correct += int((predicted == target).sum())
    accuracy = correct / len(trained.datamodule.data_test)
    assert accuracy == pytest.approx(record["final_metrics"]["test/acc"], abs=1e-6)


def test_eval_from_python_reproduces_the_runs_test_metrics(digits_run: Path, here: list[str]):
    evaluated = api.evaluate([*here, f"run_dir={digits_run}"])
    reported = json.loads((digits_run / "run.json").read_text())["final_metrics"]
    assert evaluated.metrics["test/acc"] == pytest.approx(reported["test/acc"])
    assert evaluated.run_dir.parent.parent.name == "eval"


def test_a_checkpoint_of_another_model_is_refused_in_one_line(digits_run: Path, here: list[str]):
    cnn = api.train([*here, "data=digits", "model/net=simple_cnn", *ONE_BATCH])
    with pytest.raises(ValueError, match=r"best.ckpt does not fit this model \(Missing key") as refused:
        api.load_run(digits_run, checkpoint=cnn.run_dir / "checkpoints" / "best.ckpt")
    assert "\n" not in str(refused.value)


def test_a_folder_without_a_run_record_is_refused(tmp_path: Path):
    (tmp_path / "checkpoints").mkdir()
    torch.save({"state_dict": {}}, tmp_path / "checkpoints" / "best.ckpt")
    with pytest.raises(FileNotFoundError, match=rf"run_dir={tmp_path} has no run.json"):
        api.load_run(tmp_path)


def test_compose_gives_the_config_a_run_would_get():
    cfg = api.compose("train", ["data=digits", "data.batch_size=32"])
    assert cfg.task_name == "train" and cfg.data.batch_size == 32
    datamodule = instantiate(cfg.data)  # its paths resolve as in a run
    assert Path(datamodule.hparams.data_dir) == ROOT / "data"


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
