"""Lightning's CSVLogger, with the one fix it needs here (see the class)."""

import csv

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
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
