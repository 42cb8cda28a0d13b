"""The progress bar draws on its own thread, at most `refresh_rate` times a second, and ends each bar complete;
where the output is no terminal, the run logs a line per epoch instead."""

import csv
import io
import re
import threading
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from rich.live import Live

from src.callbacks.rich_progress_bar import RichProgressBar


def seconds_to_run(bar: RichProgressBar, tmp_path: Path, test: bool = False, **loops: int) -> float:
    """Fit (then test) a BoringModel with the bar as the Trainer's only callback; how long it took."""
    trainer = L.Trainer(callbacks=[bar], logger=False, enable_checkpointing=False, enable_model_summary=False,
                        default_root_dir=tmp_path, **loops)  # fmt: skip
    started = time.monotonic()
    trainer.fit(BoringModel())
    if test:
        trainer.test(BoringModel(), verbose=False)
    return time.monotonic() - started


def test_the_training_thread_does_not_redraw_the_bar_each_epoch(tmp_path: Path, monkeypatch):
    renders, draw = [], Live.refresh  # the thread of every redraw of a rich display

    def counted(live: Live) -> None:
        renders.append(threading.current_thread().name)
        draw(live)

    monkeypatch.setattr(Live, "refresh", counted)
    screen = io.StringIO()
    bar = RichProgressBar(
        refresh_rate=4, console_kwargs={"force_terminal": True, "file": screen, "width": 120}
    )
    seconds = seconds_to_run(bar, tmp_path, max_epochs=6, limit_train_batches=7, limit_val_batches=2)
    # Lightning's own bar redraws twice an epoch on this thread (a new training bar, a new validation bar);
    # this one only when a display stops, which rich draws one last time.
    assert renders.count(threading.main_thread().name) <= 3, renders
    assert len(renders) <= 4 * seconds + 3, (len(renders), seconds)  # refresh_rate a second, and each stop
    last_drawn = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen.getvalue()).replace("\r", "\n").splitlines()
    assert re.search(r"Epoch 5/5 .* 7/7 ", [line for line in last_drawn if "Epoch" in line][-1])  # complete


def test_stopping_the_bar_does_not_wait_for_its_next_redraw(tmp_path: Path):
    # One redraw every 20 s: Lightning's refresh thread sleeps that long, and the end of fit and of test
    # waited for the sleep to end (at the default 4 redraws a second, up to 0.25 s twice in every run).
    bar = RichProgressBar(refresh_rate=0.05, console_kwargs={"force_terminal": True, "file": io.StringIO()})
    loops = {"max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 1, "limit_test_batches": 1}
    assert seconds_to_run(bar, tmp_path, test=True, **loops) < 10


def test_a_run_whose_output_is_no_terminal_logs_one_line_per_epoch(digits_run: Path):
    """`python src/train.py ... > train.out`, or a SLURM job: rich cannot draw there, so the run's log says how
    far it got, epoch by epoch, with its monitored metric."""
    log = (digits_run / "train.log").read_text()
    lines = re.findall(
        r"Epoch (\d+)/1: (\d+) steps in [0-9.]+ s, val/acc=([0-9.]+)$", log, flags=re.MULTILINE
    )
    with open(digits_run / "csv" / "version_0" / "metrics.csv") as file:
        validations = [float(row["val/acc"]) for row in csv.DictReader(file) if row["val/acc"]]
    steps = torch.load(digits_run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert [(int(epoch), int(count)) for epoch, count, _ in lines] == [(0, steps // 2), (1, steps // 2)]
    assert [float(value) for *_, value in lines] == pytest.approx(validations, abs=5e-5)
