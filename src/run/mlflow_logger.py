"""Lightning's MLFlowLogger, with the one fix it needs here (see the class)."""

import importlib.util
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from filelock import FileLock
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger


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
        if importlib.util.find_spec("mlflow") is None:  # Lightning's own error names `pip install mlflow`
            raise ModuleNotFoundError('logger=mlflow needs MLflow: pip install -e ".[mlflow]"')
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
