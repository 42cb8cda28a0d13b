"""Lightning's CSVLogger and MLFlowLogger, each with the one fix it needs here (see the classes)."""

import csv
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from filelock import FileLock
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class _AppendingWriter(ExperimentWriter):
    """Keeps the columns already in the file when a new metric adds one.

    Lightning's writer rewrites the header with only the columns it has seen itself. Under ddp_spawn the
    fit and the test stages run in different worker processes, so the test stage rewrote the fit's file
    with its own columns and failed ("dict contains fields not in fieldnames").
    """

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        with self._fs.open(self.metrics_file_path, "r", newline="") as file:
            columns = next(csv.reader(file), [])
        self.metrics_keys[:] = sorted(set(fieldnames) | set(columns))  # save() appends with these
        super()._rewrite_with_new_header(self.metrics_keys)


class CSVLogger(LightningCSVLogger):
    """`lightning.pytorch.loggers.CSVLogger` (same arguments and files) with the appending writer above."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


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
            if (
                database is not None
                and rank_zero_only.rank == 0
                and kwargs.get("run_id") is None
                and self._mlflow_client.get_experiment_by_name(experiment_name) is None
            ):
                self._mlflow_client.create_experiment(experiment_name, artifact_location=artifact_location)


def sqlite_file(tracking_uri: str | None) -> Path | None:
    """The database file of a `sqlite:///<path>` URI (`sqlite:////abs/path` for an absolute path); None
    for any other URI."""
    if not tracking_uri or not tracking_uri.startswith("sqlite:///"):
        return None
    return Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])
