"""Lightning's CSVLogger and MLFlowLogger, each with the one fix it needs here (see the classes)."""

import csv
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from filelock import FileLock
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger


class CSVLogger(LightningCSVLogger):
    """`lightning.pytorch.loggers.CSVLogger` (same arguments and files), keeping the columns already in
    metrics.csv when a new metric adds one.

    Lightning's writer rewrites the header with only the columns it has seen itself. Under ddp_spawn the
    fit and the test stages run in different worker processes, each with a copy of the writer made before
    either wrote, so the test stage rewrote the fit's file with its own columns and failed ("dict contains
    fields not in fieldnames"). Here the writer learns the file's columns before it saves.
    """

    @rank_zero_only
    def save(self) -> None:
        writer = self.experiment
        filesystem = get_filesystem(writer.metrics_file_path)
        if writer.metrics and filesystem.isfile(writer.metrics_file_path):
            with filesystem.open(writer.metrics_file_path, "r", newline="") as file:
                columns = next(csv.reader(file), [])
            if not set(columns) <= set(writer.metrics_keys):
                writer.metrics_keys[:] = sorted(set(writer.metrics_keys) | set(columns))
        super().save()


class MLFlowLogger(LightningMLFlowLogger):
    """`lightning.pytorch.loggers.MLFlowLogger` (same arguments), safe when processes open one new SQLite
    store at once.

    MLflow creates a new database's tables, and Lightning a new experiment, without a lock: torchrun's ranks
    or the parallel jobs of a sweep that started together on a new `mlflow.db` failed with alembic errors
    or "Experiment(name=train) already exists". Here each process opens the store, and rank 0 creates the
    experiment, while holding a lock file beside the database.
    """

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        tracking_uri: str | None = os.getenv("MLFLOW_TRACKING_URI"),  # Lightning's default
        artifact_location: str | None = None,
        **kwargs: Any,
    ) -> None:
        database = sqlite_file(tracking_uri)
        if database is not None:
            database.parent.mkdir(parents=True, exist_ok=True)  # for the lock file; MLflow would make it
        # A server, or a database other than SQLite, handles concurrent clients itself.
        with FileLock(f"{database}.lock") if database is not None else nullcontext():
            super().__init__(
                experiment_name=experiment_name,
                tracking_uri=tracking_uri,
                artifact_location=artifact_location,
                **kwargs,
            )
            if database is not None and rank_zero_only.rank == 0 and kwargs.get("run_id") is None:
                from mlflow.tracking import MlflowClient  # what Lightning's logger talks to the store with

                client = MlflowClient(tracking_uri)
                if client.get_experiment_by_name(experiment_name) is None:
                    client.create_experiment(experiment_name, artifact_location=artifact_location)


def sqlite_file(tracking_uri: str | None) -> Path | None:
    """The database file of a `sqlite:///<path>` URI (`sqlite:////abs/path` for an absolute path); None
    for any other URI."""
    if not tracking_uri or not tracking_uri.startswith("sqlite:///"):
        return None
    return Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])
