"""Bad input fails in one line that names the value and what is valid, before any training; and the guards."""

import logging
import re
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
    ("override", "message"),
    [
        ("trainer.max_epochs=ten", "trainer.max_epochs='ten' is not valid: expected int or null"),
        (
            "trainer.gradient_clip_val=high",
            "trainer.gradient_clip_val='high' is not valid: expected int or float or null",
        ),
        (
            "trainer.deterministic=sometimes",
            "trainer.deterministic='sometimes' is not valid: expected bool or one of warn or null",
        ),
        ("data.batch_size=64x", "data.batch_size='64x' is not valid: expected int"),
        ("data.batch_size=0", "data.batch_size=0 must be a positive integer"),
        ("data.batch_size=-8", "data.batch_size=-8 must be a positive integer"),
        ("model.optimizer.lr=0", "model.optimizer.lr=0 must be a positive number"),
        ("model.optimizer.lr=-0.01", "model.optimizer.lr=-0.01 must be a positive number"),
        (
            "model.num_classes=5",
            "model.num_classes=5 but data.num_classes=10; the model's output size must match",
        ),
    ],
)
def test_bad_values_are_refused_before_anything_is_built(compose_cfg, override: str, message: str):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        preflight.check_run(compose_cfg("train", [*DIGITS_MLP, override]))


@pytest.mark.slow
def test_a_wrong_type_on_the_command_line_stops_before_training(tmp_path: Path, data_dir: Path):
    # The refusal as the shell shows it; the others below are checked from Python, as src.api raises them.
    result = run_cli("train", *DIGITS_MLP, "trainer.max_epochs=ten", log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode != 0
    assert "trainer.max_epochs='ten' is not valid: expected int or null" in result.stderr
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
    checkpoint = tmp_path / "mlp.ckpt"
    torch.save({"state_dict": mlp.state_dict()}, checkpoint)
    bigger = instantiate(compose_cfg("train", [*DIGITS_MLP, "model.net.hidden_sizes=[128]"]).model)
    with pytest.raises(ValueError) as refused:
        check_fits(bigger, checkpoint)
    message = str(refused.value)
    assert f"ckpt_path={checkpoint} does not fit this model (" in message
    assert "size mismatch for net.layers.1.weight: copying a param with shape torch.Size([64, 64])" in message
    assert "was it trained with another model=, model/net=, data= or mode=" in message
    cnn = instantiate(compose_cfg("train", ["data=digits", "model=classifier"]).model)
    with pytest.raises(
        ValueError,
        match=r'Missing key\(s\) in state_dict: "net.features.0.weight", .* Unexpected key\(s\) in state_dict: .*"net.layers.1.weight"',
    ):
        check_fits(cnn, checkpoint)


def test_a_checkpoint_that_fits_passes(compose_cfg, tmp_path: Path):
    model = instantiate(compose_cfg("train", DIGITS_MLP).model)
    torch.save({"state_dict": model.state_dict()}, tmp_path / "same.ckpt")
    check_fits(model, tmp_path / "same.ckpt")


# --- training guards ---


def test_a_nan_loss_stops_the_run_before_it_reaches_the_weights(here: list[str], tmp_path: Path):
    # data.std=0 divides the pixels by zero: the very first loss is NaN.
    with pytest.raises(
        FloatingPointError,
        match=r"the training loss is NaN/Inf at epoch 0, step 0: stopped before it reached the weights",
    ):
        api.train([*here, *DIGITS_MLP, "data.std=0"])
    assert not list(
        only_run_dir(tmp_path).glob("checkpoints/*.ckpt")
    )  # no NaN state saved, best or otherwise


def test_a_first_loss_far_from_ln_num_classes_is_warned_about(here: list[str]):
    # A tiny std blows the inputs up, and without BatchNorm the logits follow: the first loss is ~30.
    rigged = ["debug=fdr", *DIGITS_MLP, "data.std=0.001", "model.net.batch_norm=false"]
    run = api.train([*here, *rigged])
    log = (run.run_dir / "debug.log").read_text()
    assert "far from ln(10) = 2.3, what an untrained classifier should give" in log, log[-3000:]


def test_unused_parameters_are_named(compose_cfg, caplog):
    cfg = compose_cfg("train", DIGITS_MLP)
    model = instantiate(cfg.model)
    model.unused = torch.nn.Linear(2, 2)  # a layer the loss never reaches
    datamodule = instantiate(cfg.data, _convert_="all")
    trainer = L.Trainer(
        fast_dev_run=True, callbacks=[TrainingGuards()], logger=False, enable_progress_bar=False
    )
    with caplog.at_level(logging.WARNING):
        trainer.fit(model, datamodule=datamodule)
    assert "2 parameter(s) got no gradient in the first step: unused.weight, unused.bias" in caplog.text
    assert "far from ln(10)" not in caplog.text  # a normal first loss draws no warning


@pytest.mark.parametrize(
    ("every", "limit", "read_at"),
    [
        (4, 10, "in 4 of the 4 steps up to epoch 0, step 4"),
        (50, 3, "in 3 of the 3 steps up to epoch 0, step 3"),
    ],
)
def test_off_a_single_cpu_the_nan_check_reads_its_flag_every_n_steps_and_at_epoch_end(
    compose_cfg, every: int, limit: int, read_at: str
):
    # What a GPU or a multi-process run does by default (every 50 steps), here on the CPU: the check never
    # syncs per step, and the run stops at the next read, before the epoch's validation and checkpoints.
    cfg = compose_cfg("train", [*DIGITS_MLP, "data.std=0"])  # NaN inputs: every loss is NaN
    guards = TrainingGuards(check_initial_loss=False, nonfinite_every_n_steps=every)
    trainer = L.Trainer(
        max_epochs=1, limit_train_batches=limit, callbacks=[guards], logger=False, enable_progress_bar=False
    )
    with pytest.raises(
        FloatingPointError, match=re.escape(f"the training loss is NaN/Inf {read_at}")
    ) as error:
        trainer.fit(instantiate(cfg.model), datamodule=instantiate(cfg.data, _convert_="all"))
    assert f"(read every {every} steps; callbacks.training_guards.nonfinite_every_n_steps=1" in str(
        error.value
    )


@pytest.mark.parametrize(
    ("callback", "message"),
    [
        (
            lambda: TrainingGuards(nonfinite_every_n_steps=0),
            "callbacks.training_guards.nonfinite_every_n_steps=0 must be >= 1 or null",
        ),
        (
            lambda: Throughput(warmup_steps=-1),
            "callbacks.throughput.warmup_steps=-1 must be 0 or more",
        ),
        (
            lambda: LastCheckpoint("checkpoints", min_seconds_between=-5),
            "callbacks.last_checkpoint.min_seconds_between=-5 must be 0 or more",
        ),
    ],
)
def test_bad_callback_settings_are_refused(callback, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        callback()
