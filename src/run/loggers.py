"""Lightning's CSVLogger, with the one fix it needs here (see the class)."""

import csv

from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger


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
