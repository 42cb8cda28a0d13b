"""The MLflow logger: sweep jobs and torchrun's ranks (tests/test_launchers.py) share one SQLite store, each
run with its params, metrics and pictures; without its extra it names the extra."""

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from tests.conftest import ROOT, cli_env, last_metrics, run_cli

DIGITS_MLP = ["data=digits", "model/net=mlp", "trainer.max_epochs=2"]


def mlflow_runs(log_dir: Path, experiment: str) -> tuple[Any, list]:
    """MLflow's own client on the SQLite store under `log_dir`, and the runs of one experiment in it."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{log_dir}/mlflow.db")
    return client, client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


@pytest.mark.slow
def test_mlflow_sweep_jobs_share_one_sqlite_file_with_their_params_metrics_and_pictures(
    tmp_path: Path, data_dir: Path
):
    # Started from another folder: nothing may land in the working directory (MLflow's default ./mlruns).
    log_dir = tmp_path / "logs"
    overrides = ["-m", *DIGITS_MLP, "model.optimizer.lr=0.001,0.01", "logger=[csv,mlflow]"]
    overrides.append("callbacks=[default,prediction_pictures]")  # [part: diagnostics]
    result = run_cli("train", *overrides, log_dir=log_dir, data_dir=data_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]
    assert {"mlflow.db", "mlflow-artifacts"} <= {p.name for p in log_dir.iterdir()}
    client, runs = mlflow_runs(log_dir, "train")
    runs = {run.data.params["model/optimizer/lr"]: run for run in runs}
    assert sorted(runs) == ["0.001", "0.01"]  # one run per job, each with its own hyperparameters
    (sweep,) = (log_dir / "train" / "multiruns").iterdir()
    for job, lr in (("0", "0.001"), ("1", "0.01")):
        run = runs[lr]
        assert run.info.status == "FINISHED" and f"model.optimizer.lr={lr}" in run.info.run_name.split(",")
        assert run.data.params["trainer/max_epochs"] == "2" and run.data.params["run/world_size"] == "1"
        metrics = run.data.metrics
        assert {"train/loss", "train/acc", "val/loss", "val/acc", "val/acc_best", "test/acc"} <= set(metrics)
        assert metrics["test/acc"] == pytest.approx(last_metrics(sweep / job)["test/acc"])  # as in its CSV
        assert len(client.get_metric_history(run.info.run_id, "val/acc")) == 2  # one per epoch
        artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
        assert artifacts.is_relative_to(log_dir / "mlflow-artifacts")
        # part: diagnostics
        assert {"val~confusion_matrix", "test~confusion_matrix", "test~predictions"} <= {
            p.name.split("+", 1)[0] for p in (artifacts / "images").glob("*.png")
        }
        # /part


def open_at_go(folder: str | Path, number: int) -> None:
    """Open a new SQLite store in `folder` as soon as the file `go` appears there, and log one metric."""
    import mlflow.tracking  # noqa: F401 - imported before the start, so that the processes open it at once

    from src.run.mlflow_logger import MLFlowLogger

    folder = Path(folder)
    (folder / f"ready-{number}").touch()
    while not (folder / "go").exists():
        time.sleep(0.01)
    logger = MLFlowLogger(experiment_name="train", tracking_uri=f"sqlite:///{folder}/mlflow.db")
    logger.log_metrics({"val/acc": float(number)}, step=0)
    logger.finalize("success")


@pytest.mark.slow
def test_processes_that_open_a_new_mlflow_store_at_once_all_log(tmp_path: Path):
    """torchrun's ranks, or the parallel jobs of a sweep, start together on a new mlflow.db; without the lock
    MLflow's table creation and Lightning's experiment creation collided (alembic or "already exists")."""
    call = f"from tests.test_mlflow import open_at_go; open_at_go({str(tmp_path)!r}, 1)"
    with open(tmp_path / "other.err", "w") as error:  # another process, and this one
        other = subprocess.Popen([sys.executable, "-c", call], cwd=ROOT, env=cli_env(), stderr=error)
    while not (tmp_path / "ready-1").exists() and other.poll() is None:
        time.sleep(0.05)
    (tmp_path / "go").touch()
    open_at_go(tmp_path, 0)
    assert other.wait(120) == 0, (tmp_path / "other.err").read_text()[-3000:]
    _, runs = mlflow_runs(tmp_path, "train")
    assert sorted(run.data.metrics["val/acc"] for run in runs) == [0.0, 1.0]


def test_mlflow_without_its_extra_names_the_extra(compose_cfg, monkeypatch: pytest.MonkeyPatch):
    # As in an install without the extra: `import mlflow` fails and find_spec("mlflow") is None.
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(
        InstantiationException, match=re.escape('logger=mlflow needs MLflow: pip install -e ".[mlflow]"')
    ):
        instantiate(compose_cfg("train", ["logger=mlflow"]).logger.mlflow)
