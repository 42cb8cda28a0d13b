"""Bad input fails in one line that names the value and what is valid, before any training; and the guards."""

import logging
import re
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate

from src import api
from src.callbacks.last_checkpoint import LastCheckpoint
from src.callbacks.throughput import Throughput
from src.callbacks.training_guards import TrainingGuards
from src.run import preflight
from src.run.checkpoints import check_fits
from tests.conftest import only_run_dir, run_cli

DIGITS_MLP = ["data=digits", "model/net=mlp"]


@pytest.mark.parametrize(
    ("override", "says"),  # the error names the key, then says this
    [
        ("trainer.max_epochs=ten", "'ten' is not valid: expected int or null"),
        ("trainer.gradient_clip_val=high", "'high' is not valid: expected int or float or null"),
        ("trainer.deterministic=sometimes", "'sometimes' is not valid: expected bool or one of warn or null"),
        ("data.batch_size=64x", "'64x' is not valid: expected int"),
        ("data.batch_size=0", "0 must be a positive integer"),
        ("data.batch_size=-8", "-8 must be a positive integer"),
        ("model.optimizer.lr=0", "0 must be a positive number"),
        ("model.optimizer.lr=-0.01", "-0.01 must be a positive number"),
        ("model.num_classes=5", "5 but data.num_classes=10; the model's output size must match"),
    ],
)
def test_bad_values_are_refused_before_anything_is_built(compose_cfg, override: str, says: str):
    key = override.partition("=")[0]
    with pytest.raises(ValueError, match=re.escape(f"{key}={says}")):
        preflight.check_run(compose_cfg("train", [*DIGITS_MLP, override]))


@pytest.mark.slow
def test_a_bad_value_on_the_command_line_stops_in_one_line_before_training(tmp_path: Path, data_dir: Path):
    # The refusal as the shell shows it; the others are checked from Python, as src.api raises them.
    result = run_cli("train", *DIGITS_MLP, "trainer.max_epochs=ten", log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode != 0
    assert "trainer.max_epochs='ten' is not valid: expected int or null" in result.stderr
    assert "site-packages/lightning" not in result.stderr  # refused before Lightning was involved
    assert not (only_run_dir(tmp_path) / "checkpoints").exists()  # nothing was trained or saved


def test_a_typo_in_a_key_names_the_key(here: list[str], tmp_path: Path):
    with pytest.raises(
        ConfigCompositionException, match=r"Could not override 'trainer.max_epoch'"
    ) as refused:
        api.train([*here, "trainer.max_epoch=3"])
    assert "Key 'max_epoch' is not in struct" in str(refused.value.__cause__)
    assert not (tmp_path / "train").exists()  # Hydra refused it before creating a run dir


def test_a_checkpoint_of_another_model_lists_every_tensor_that_differs(compose_cfg, tmp_path: Path):
    mlp = instantiate(compose_cfg("train", [*DIGITS_MLP, "model.net.hidden_sizes=[64]"]).model)
    torch.save({"state_dict": mlp.state_dict()}, checkpoint := tmp_path / "mlp.ckpt")
    bigger = instantiate(compose_cfg("train", [*DIGITS_MLP, "model.net.hidden_sizes=[128]"]).model)
    with pytest.raises(ValueError) as refused:
        check_fits(bigger, checkpoint)
    message = str(refused.value)
    assert f"ckpt_path={checkpoint} does not fit this model (" in message
    assert "size mismatch for net.layers.1.weight: copying a param with shape torch.Size([64, 64])" in message
    cnn = instantiate(compose_cfg("train", ["data=digits", "model=classifier"]).model)
    with pytest.raises(
        ValueError, match=r'Missing key\(s\) .*"net.features.0.weight", .*Unexpected key\(s\)'
    ):
        check_fits(cnn, checkpoint)


def fit(cfg, guards: TrainingGuards, model: L.LightningModule | None = None, **trainer_args) -> None:
    """Fit `cfg`'s model (or `model`) on its data, with `guards` the only callback."""
    trainer = L.Trainer(callbacks=[guards], logger=False, enable_progress_bar=False, **trainer_args)
    trainer.fit(model or instantiate(cfg.model), datamodule=instantiate(cfg.data, _convert_="all"))


def test_a_nan_loss_stops_the_run_before_it_reaches_the_weights(here: list[str], tmp_path: Path):
    # data.std=0 divides the pixels by zero: the very first loss is NaN.
    stopped = r"the training loss is NaN/Inf at epoch 0, step 0: stopped before it reached the weights"
    with pytest.raises(FloatingPointError, match=stopped):
        api.train([*here, *DIGITS_MLP, "data.std=0"])
    assert not list(only_run_dir(tmp_path).glob("checkpoints/*.ckpt"))  # no NaN state saved, best or other


def test_the_first_step_warns_of_a_wild_loss_and_of_unused_parameters(compose_cfg, caplog):
    # A tiny std blows the inputs up, and without BatchNorm the logits follow: the first loss is ~30.
    wild = compose_cfg("train", [*DIGITS_MLP, "data.std=0.001", "model.net.batch_norm=false"])
    with caplog.at_level(logging.WARNING):
        fit(wild, TrainingGuards(), fast_dev_run=True)
        assert "far from ln(10) = 2.3, what an untrained classifier should give" in caplog.text
        caplog.clear()
        cfg = compose_cfg("train", DIGITS_MLP)
        model = instantiate(cfg.model)
        model.unused = torch.nn.Linear(2, 2)  # a layer the loss never reaches
        fit(cfg, TrainingGuards(), model, fast_dev_run=True)
    assert "2 parameter(s) got no gradient in the first step: unused.weight, unused.bias" in caplog.text
    assert "far from ln(10)" not in caplog.text  # a normal first loss draws no warning


@pytest.mark.parametrize(
    ("every", "limit", "read_at"), [(4, 10, 4), (50, 3, 3)]
)  # at step 4; at the epoch's end
def test_off_a_single_cpu_the_nan_check_reads_its_flag_every_n_steps_and_at_epoch_end(
    compose_cfg, every: int, limit: int, read_at: int
):
    # What a GPU or a multi-process run does by default (every 50 steps), here on the CPU: the check never
    # syncs per step, and the run stops at the next read, before the epoch's validation and checkpoints.
    nan = compose_cfg("train", [*DIGITS_MLP, "data.std=0"])  # NaN inputs: every loss is NaN
    guards = TrainingGuards(check_initial_loss=False, nonfinite_every_n_steps=every)
    stopped = (
        f"the training loss is NaN/Inf in {read_at} of the {read_at} steps up to epoch 0, step {read_at}"
    )
    hint = f" (read every {every} steps; callbacks.training_guards.nonfinite_every_n_steps=1"
    with pytest.raises(FloatingPointError, match=re.escape(stopped + hint)):
        fit(nan, guards, max_epochs=1, limit_train_batches=limit)


@pytest.mark.parametrize(
    ("callback", "setting", "says"),
    [
        (TrainingGuards, "training_guards.nonfinite_every_n_steps=0", "must be >= 1 or null"),
        (Throughput, "throughput.warmup_steps=-1", "must be 0 or more"),
        (
            partial(LastCheckpoint, "checkpoints"),
            "last_checkpoint.min_seconds_between=-5",
            "must be 0 or more",
        ),
    ],
)
def test_bad_callback_settings_are_refused(callback, setting: str, says: str):
    key, value = setting.split(".")[1].split("=")
    with pytest.raises(ValueError, match=re.escape(f"callbacks.{setting} {says}")):
        callback(**{key: int(value)})
