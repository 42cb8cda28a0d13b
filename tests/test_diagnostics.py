"""The default callbacks are those a run needs to be safe and resumable; each diagnostic is off until its one
documented override, `'callbacks=[default,<name>]'`, turns it on."""

import re
from pathlib import Path

import lightning as L
import pytest
from hydra.utils import instantiate

from src import api
from src.callbacks.training_guards import TrainingGuards
from src.run.builder import instantiate_group, skip_idle_batch_hooks
from tests.conftest import CONFIG_DIR, ROOT, last_metrics

DIGITS_MLP = ["data=digits", "model/net=mlp"]

NEEDED = {
    "model_checkpoint",
    "last_checkpoint",
    "interrupt_checkpoint",
    "resume_state",
    "early_stopping",
    "lr_monitor",
    "rich_progress_bar",
    "training_guards",
}
DIAGNOSTICS = ["throughput", "histograms", "prediction_pictures", "model_summary"]
DIAGNOSTICS.append("segmentation_pictures")  # [part: segmentation]


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


def test_the_configuration_reference_lists_every_callback_option():
    """docs/configuration.md, which every generated project keeps (its README is its owner's), has a table
    row or a list item for each option but `default` and `none`, which its text describes; each diagnostic's
    file documents its override."""
    reference = (ROOT / "docs" / "configuration.md").read_text()
    options = sorted(
        path.stem
        for path in (CONFIG_DIR / "callbacks").glob("*.yaml")
        if path.stem not in ("default", "none")
    )
    listed = [name for name in options if f"\n| `{name}` |" in reference or f"\n- `{name}`: " in reference]
    assert listed == options


def test_throughput_and_the_model_summary_show_when_asked_for(here: list[str], capsys):
    # Histograms and prediction pictures are checked in a real run with every logger (test_tracking.py).
    run = api.train(
        [*here, *DIGITS_MLP, "trainer.max_epochs=1", "callbacks=[default,throughput,model_summary]"]
    )
    metrics = last_metrics(run.run_dir)
    assert metrics["perf/train_samples_per_sec"] > 0 and metrics["perf/fit_samples_per_sec"] > 0
    # On the console only, not in the log file; max_depth=2 (Lightning's own summary lists only `net`).
    assert (
        "net.layers" in capsys.readouterr().out
        and "net.layers" not in (run.run_dir / "train.log").read_text()
    )


def test_the_profiler_times_the_batch_hooks_that_do_something(here: list[str], capsys):
    # Lightning would call every batch hook of every callback at each batch; the ones that are empty or idle
    # under the callback's settings are skipped (src/run/builder.py), the others still run and are timed.
    # capsys: the console is no terminal, as in a batch job, whatever runs the tests (else the bar would draw).
    run = api.train([*here, *DIGITS_MLP, "debug=profiler"])
    timed = (run.run_dir / "debug.log").read_text()
    for hook in (
        "TrainingGuards.on_before_backward",  # the NaN guard, at every step
        "TrainingGuards.on_after_backward",  # unused parameters, at the first step
        "ResumeState.on_train_start",  # hooks outside the batch loop: called as Lightning does
    ):
        assert f"[Callback]{hook}" in timed, hook
    for hook in (
        "ResumeState.on_train_batch_start",  # not implemented
        "InterruptCheckpoint.on_before_backward",
        "TrainingGuards.on_validation_batch_end",
        "LearningRateMonitor.on_train_batch_start",  # idle: logging_interval=epoch
        "LastCheckpoint.on_train_batch_end",  # idle: every_n_train_steps=null
        "TrainingGuards.on_before_optimizer_step",  # idle: log_grad_norm=false
        "TrainingGuards.on_train_batch_end",  # idle: the loss is checked as it comes on one CPU process
        "RichProgressBar.on_train_batch_end",  # idle: no terminal to draw a bar on
        "RichProgressBar.on_validation_batch_end",
    ):
        assert f"[Callback]{hook}" not in timed, hook
    checkpoint = r"\[Callback\]ModelCheckpoint\{[^}]*\}\."  # its profiler name holds its settings
    assert re.search(checkpoint + "on_validation_end", timed)  # where it saves the best checkpoint
    assert not re.search(checkpoint + "on_train_batch_end", timed)  # idle: no every_n_train_steps


def test_a_batch_hook_runs_when_a_setting_needs_it(compose_cfg, tmp_path: Path):
    # The same callbacks as above, with the options that give each skipped hook work to do.
    overrides = [
        f"paths.output_dir={tmp_path}",
        "callbacks.lr_monitor.logging_interval=step",
        "callbacks.last_checkpoint.every_n_train_steps=100",
        "callbacks.model_checkpoint.every_n_train_steps=100",
        "callbacks.training_guards.log_grad_norm=true",
        "callbacks.training_guards.nonfinite_every_n_steps=10",
    ]
    callbacks = instantiate_group(compose_cfg("train", overrides).callbacks, "callbacks")
    trainer = L.Trainer(callbacks=callbacks, logger=False, accelerator="cpu", default_root_dir=tmp_path)
    skip_idle_batch_hooks(trainer)
    by_name = {type(callback).__name__: callback for callback in trainer.callbacks}
    for name, hook in (
        ("LearningRateMonitor", "on_train_batch_start"),
        ("LastCheckpoint", "on_train_batch_end"),
        ("ModelCheckpoint", "on_train_batch_end"),
        ("TrainingGuards", "on_before_optimizer_step"),
        ("TrainingGuards", "on_train_batch_end"),
    ):
        assert callable(getattr(by_name[name], hook)), f"{name}.{hook}"
    assert by_name["ResumeState"].on_train_batch_start is None  # never any work to do


def test_the_training_guards_log_the_gradient_norm_when_asked(compose_cfg):
    cfg = compose_cfg("train", DIGITS_MLP)
    guards = TrainingGuards(log_grad_norm=True)
    trainer = L.Trainer(fast_dev_run=True, callbacks=[guards], logger=False, enable_progress_bar=False)
    trainer.fit(instantiate(cfg.model), datamodule=instantiate(cfg.data, _convert_="all"))
    assert trainer.callback_metrics["grad_2.0_norm_total"] > 0


def test_debug_presets_draw_no_pictures(compose_cfg):
    pictures = "callbacks=[default,prediction_pictures]"
    for preset in ("fdr", "limit", "overfit", "profiler", "default"):
        assert (
            compose_cfg("train", [pictures, f"debug={preset}"]).callbacks.get("prediction_pictures") is None
        )
    assert compose_cfg("train", [pictures]).callbacks.prediction_pictures is not None
