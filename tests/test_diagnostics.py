"""The default callbacks are those a run needs to be safe and resumable; each diagnostic is off until its one
documented override, `'callbacks=[default,<name>]'`, turns it on."""

from pathlib import Path

import pytest

from tests.conftest import CONFIG_DIR, ROOT, last_metrics, only_run_dir, run_cli

NEEDED = {
    "model_checkpoint",
    "last_checkpoint",
    "interrupt_checkpoint",
    "rng_state",
    "early_stopping",
    "lr_monitor",
    "rich_progress_bar",
    "training_guards",
}
DIAGNOSTICS = ("throughput", "histograms", "prediction_pictures", "model_summary")


def test_the_default_callbacks_are_those_a_run_needs(compose_cfg):
    assert set(compose_cfg("train").callbacks) == NEEDED


@pytest.mark.parametrize("name", DIAGNOSTICS)
def test_each_diagnostic_turns_on_with_its_documented_override(compose_cfg, name: str):
    override = f"callbacks=[default,{name}]"
    assert f"'{override}'" in (CONFIG_DIR / "callbacks" / f"{name}.yaml").read_text()  # documented there
    callbacks = compose_cfg("train", [override]).callbacks
    assert set(callbacks) == NEEDED | {name}
    if name == "histograms":
        assert callbacks.histograms.log == "gradients"  # asked for: on, not waiting for another key


def test_the_readme_lists_every_diagnostic_with_its_override():
    readme = (ROOT / "README.md").read_text()
    for name in DIAGNOSTICS:
        assert f"'callbacks=[default,{name}]'" in readme, name


def test_throughput_and_the_model_summary_show_when_asked_for(tmp_path: Path, data_dir: Path):
    # Histograms and prediction pictures are checked in a real run with every logger (test_tracking.py).
    overrides = ["data=digits", "model/net=mlp", "trainer.max_epochs=1"]
    result = run_cli(
        "train",
        *overrides,
        "callbacks=[default,throughput,model_summary]",
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = last_metrics(only_run_dir(tmp_path))
    assert metrics["perf/train_samples_per_sec"] > 0 and metrics["perf/fit_samples_per_sec"] > 0
    assert "net.layers" in result.stdout  # RichModelSummary's max_depth=2 (Lightning's own lists only `net`)


def test_the_profiler_times_the_batch_hooks_the_callbacks_implement(tmp_path: Path, data_dir: Path):
    # Lightning would call every hook of every callback at each batch; the empty ones are skipped
    # (src/run/builder.py), the ones a callback implements still run and are timed.
    result = run_cli(
        "train", "data=digits", "model/net=mlp", "debug=profiler", log_dir=tmp_path, data_dir=data_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    timed = result.stdout
    for hook in (
        "TrainingGuards.on_before_backward",  # the NaN guard, at every step
        "LearningRateMonitor.on_train_batch_start",
        "RichProgressBar.on_train_batch_end",
        "LastCheckpoint.on_train_batch_end",
    ):
        assert f"[Callback]{hook}" in timed, hook
    for hook in (
        "RNGState.on_train_batch_start",
        "InterruptCheckpoint.on_before_backward",
        "TrainingGuards.on_validation_batch_end",
    ):
        assert f"[Callback]{hook}" not in timed, hook
    assert (
        "[Callback]RNGState.on_train_start" in timed
    )  # hooks outside the batch loop: called as Lightning does
