"""Never lose a run: named runs that resume exactly, atomic checkpoints, safe loading."""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from src import api
from src.callbacks.interrupt_checkpoint import InterruptCheckpoint
from src.callbacks.last_checkpoint import LastCheckpoint
from src.run.checkpoints import load_checkpoint
from src.run.resume import plan_resume
from tests.conftest import start_cli
from tests.helpers import InterruptAtStep, StopAt
from tests.test_tracking import wandb_records

# Digits + MLP, 2 epochs of 21 steps, every random choice seeded and deterministic.
EXACT = ["data=digits", "model/net=mlp", "trainer.max_epochs=2", "trainer.deterministic=true"]
# The best checkpoint judged every 7 steps and the latest state saved every 3, on EXACT's 21 steps an epoch:
# saves of both kinds on the same steps, on epochs' last batches (before their validation) and in between.
STEP_SAVES = [
    "callbacks.model_checkpoint.every_n_train_steps=7",
    "callbacks.last_checkpoint.every_n_train_steps=3",
]
STOPPABLE = "+callbacks.stop._target_=tests.helpers.StopAt"  # sends SIGTERM at StopAt.moment


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


# --- a named run continues where it stopped, with the same config, until it is done ---


@pytest.mark.slow  # wandb starts its service
def test_a_named_run_continues_with_the_same_command_until_it_is_done(here: list[str], tmp_path: Path):
    common = [*here, "debug=limit", "data=digits", "model/net=mlp", "run_name=exp"]
    common += ["+callbacks.interrupt._target_=tests.helpers.InterruptAtStep"]
    with_wandb = [*common, "logger=wandb", "logger.wandb.offline=true"]
    InterruptAtStep.step = 15  # Ctrl+C in the middle of epoch 1
    sigint = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit):
        api.train(with_wandb)
    assert signal.getsignal(signal.SIGINT) == sigint  # Ctrl+C works again in the caller (a notebook's kernel)
    run_dir = tmp_path / "debug" / "runs" / "exp"
    assert record(run_dir)["status"] == "interrupted"
    assert load_checkpoint(run_dir / "checkpoints" / "interrupted.ckpt")["global_step"] == 15

    snapshot = (run_dir / ".hydra" / "config.yaml").read_text()
    with pytest.raises(
        ValueError, match=r"run exp was started with another config \(model.optimizer.lr: 0.001 -> 0.5"
    ):
        api.train([*with_wandb, "model.optimizer.lr=0.5"])
    assert (run_dir / ".hydra" / "config.yaml").read_text() == snapshot  # the first snapshot is kept
    assert len(list((run_dir / ".hydra" / "attempts").iterdir())) == 1  # the refused attempt's, beside it
    assert record(run_dir)["status"] == "interrupted"  # and the record is the first attempt's

    api.train(with_wandb)
    assert "Resuming run exp (stopped interrupted)" in (run_dir / "debug.log").read_text()
    resumed = record(run_dir)
    assert resumed["status"] == "completed" and resumed["resumed"]["checkpoint"].endswith("interrupted.ckpt")
    wandb_runs = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    run_ids = {r.run.run_id for path in wandb_runs for r in wandb_records(path) if r.HasField("run")}
    assert len(wandb_runs) == 2 and len(run_ids) == 1  # one wandb run, continued

    finished = r"run exp \(.*already finished on .*resume=never \(it becomes exp-2\) or"
    with pytest.raises(FileExistsError, match=finished):
        api.train(with_wandb)
    fresh = api.train([*common, "resume=never"])
    assert fresh.run_dir == run_dir.with_name("exp-2") and record(fresh.run_dir)["status"] == "completed"
    assert record(run_dir)["status"] == "completed"  # the first is untouched


@pytest.mark.parametrize("value", ["sometimes", "yes"])
def test_an_unknown_resume_mode_is_refused(compose_cfg, value):
    with pytest.raises(ValueError, match=rf"resume={value} is not valid; choose auto .* or never"):
        plan_resume(compose_cfg("train", [f"resume={value}"]))


def test_a_run_name_with_a_path_in_it_is_refused(here: list[str]):
    with pytest.raises(ValueError, match=r"run_name='../elsewhere' is not a valid directory name"):
        api.train([*here, "run_name=../elsewhere"])


def test_eval_run_dir_tests_the_checkpoint_the_run_tested_whatever_its_name(here: list[str]):
    named = "callbacks.model_checkpoint.filename='epoch_{epoch:03d}'"
    trained = api.train([*here, "data=digits", "model/net=mlp", "trainer.max_epochs=1", named])
    tested = record(trained.run_dir)["tested_checkpoint"]
    assert tested.startswith("checkpoints/epoch_") and (trained.run_dir / tested).is_file()
    evaluation = api.evaluate([*here, f"run_dir={trained.run_dir}"])
    assert evaluation.metrics["test/acc"] == trained.metrics["test/acc"]
    assert record(evaluation.run_dir)["tested_checkpoint"] == str(trained.run_dir / tested)


# --- checkpoints: atomic writes, safe loading ---


class _FailsHalfway:
    """Pickles into an error, after the tensors before it were already written."""

    def __reduce__(self):
        raise OSError("disk full (simulated)")


class SavedSteps(L.Callback):
    """The step of every checkpoint the trainer saves."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_save_checkpoint(self, trainer: L.Trainer, *args) -> None:
        self.steps.append(trainer.global_step)


@pytest.mark.parametrize(
    ("latest", "limits", "saved_steps"),
    [
        ({}, {"max_epochs": 3, "limit_train_batches": 2}, [2, 4, 6]),  # each epoch's end
        ({"min_seconds_between": 3600}, {"max_epochs": 3, "limit_train_batches": 2}, [2, 6]),  # first, last
        ({"every_n_train_steps": 2}, {"max_steps": 6, "limit_train_batches": 4}, [2, 4, 6]),  # 6: saved once
    ],
    ids=["every epoch", "short epochs", "last step"],
)
def test_the_latest_state_is_saved_at_epoch_ends_and_steps_but_short_epochs_skip_it_and_none_twice(
    tmp_path: Path, latest: dict, limits: dict, saved_steps: list[int]
):
    saved = SavedSteps()
    trainer = L.Trainer(
        **limits, limit_val_batches=1,
        callbacks=[LastCheckpoint(str(tmp_path), **latest), saved], logger=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(BoringModel())
    assert saved.steps == saved_steps


def test_the_trainer_writes_checkpoints_atomically_so_a_failed_write_leaves_the_previous_one(compose_cfg):
    cfg = compose_cfg("train")
    io, target = instantiate(cfg.trainer).strategy.checkpoint_io, Path(cfg.paths.output_dir) / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, target)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(1_000_000)}, "bad": _FailsHalfway()}, target)
    assert torch.equal(load_checkpoint(target)["state_dict"]["w"], torch.ones(3))  # the old one, intact
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]  # no temporary left behind


class _Payload:
    """What an attacker puts in a checkpoint: unpickling it runs a command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("task", [api.evaluate, api.train], ids=["eval", "train"])
def test_a_checkpoint_with_a_pickle_payload_is_refused_and_never_runs(here: list[str], tmp_path: Path, task):
    marker, checkpoint = tmp_path / "pwned", tmp_path / "model.ckpt"
    torch.save({"state_dict": {}, "extra": _Payload(marker)}, checkpoint)
    refused = f"ckpt_path={checkpoint} holds Python objects that are not plain data, so it was not loaded"
    with pytest.raises(ValueError, match=re.escape(refused)):
        task([*here, "data=digits", "model/net=mlp", f"ckpt_path={checkpoint}"])
    assert not marker.exists()  # the payload did not run


def test_a_new_fit_never_picks_up_a_last_checkpoint_it_was_not_given(tmp_path: Path):
    # Lightning resumes `fit(ckpt_path=None)` from the newest last*.ckpt when an OnExceptionCheckpoint is among
    # the callbacks; the interrupt checkpoint is not one, so src/run/resume.py decides what a run continues from.
    class Steps(L.Callback):
        trained = 0

        def on_train_batch_end(self, *args, **kwargs) -> None:
            self.trained += 1

    def steps_of_a_new_fit() -> int:
        steps = Steps()
        checkpoints = [InterruptCheckpoint(dirpath=str(tmp_path)), ModelCheckpoint(tmp_path, save_last=True)]
        trainer = L.Trainer(
            max_epochs=2, limit_train_batches=3, limit_val_batches=1, callbacks=[steps, *checkpoints],
            logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        )  # fmt: skip
        trainer.fit(BoringModel())
        return steps.trained

    assert steps_of_a_new_fit() == 6
    assert (tmp_path / "last.ckpt").exists()
    assert steps_of_a_new_fit() == 6  # not resumed from the first fit's last.ckpt: all 6 steps again


def test_an_interrupt_checkpoint_without_a_file_name_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match=r"callbacks\.interrupt_checkpoint\.filename is empty"):
        InterruptCheckpoint(dirpath=str(tmp_path), filename="")


# --- a run stopped at any moment ends as if it had never stopped ---


def outcome(run_dir: Path) -> tuple[dict, dict]:
    """What a user reads of a finished run: its checkpoint files, the best one's step, its metrics (but timings
    and the learning rate, logged at epoch starts, which a run resumed mid-epoch does not replay) and the
    checkpoint they were tested on; and its best and final weights."""
    best, last = (load_checkpoint(run_dir / "checkpoints" / name) for name in ("best.ckpt", "last.ckpt"))
    ran = record(run_dir)
    return {
        "files": sorted(path.name for path in (run_dir / "checkpoints").iterdir()),
        "best step": best["global_step"],
        "metrics": {k: v for k, v in ran["final_metrics"].items() if not k.startswith(("lr-", "perf/"))},
        "tested": ran["tested_checkpoint"],
    }, {"best": best["state_dict"], "last": last["state_dict"]}


def assert_same_outcome(run_dir: Path, expected: tuple[dict, dict], moment: str) -> None:
    files_and_metrics, weights = outcome(run_dir)
    assert files_and_metrics == expected[0], f"{moment}: not as the run that never stopped"
    torch.testing.assert_close(weights, expected[1], rtol=0, atol=0, msg=lambda error: f"{moment}: {error}")


SIGTERMS = [  # (after step, in validation batch, interrupted.ckpt saved)
    (10, None, True),  # mid-epoch
    (21, None, False),  # after an epoch's last step: stopped in the validation that follows it
    (21, 2, False),  # in the middle of that validation (Lightning could not continue from there)
    (41, None, True),  # the step before an epoch's last
]


# A step's save of the best checkpoint before a validation waits for it, and the run resumed from a checkpoint
# written meanwhile saves it too.
VALIDATION_TWICE = [
    "+trainer.val_check_interval=0.5",
    *STEP_SAVES[:1],
    "callbacks.last_checkpoint.every_n_train_steps=5",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("saves", "sigterms"),
    [(STEP_SAVES, SIGTERMS), (VALIDATION_TWICE, [])],
    ids=["step saves", "step saves and validation twice an epoch"],
)
def test_a_run_killed_or_stopped_at_any_moment_ends_as_if_it_never_stopped(
    here: list[str], tmp_path: Path, saves: list[str], sigterms: list
):
    """Train a named run once, keeping a copy of its files after every checkpoint write (each state a kill
    can leave, as each write is atomic); put each copy back and run the same command again; then stop it by
    SIGTERM at the given moments and run it again: every run ends as the first."""
    moments = tmp_path / "moments"
    command = [
        *here,
        *EXACT,
        *saves,
        "model.net.dropout=0.2",
        "data.random_shift=1",
    ]  # both draw random numbers
    command += [
        STOPPABLE,
        f"trainer.plugins=[{{_target_:tests.helpers.SnapshotCheckpointIO,folder:'{moments}'}}]",
    ]
    command += ["run_name=any"]
    run_dir = api.train(command).run_dir
    expected = outcome(run_dir)
    assert expected[0]["files"] == ["best.ckpt", "last.ckpt"]
    assert expected[0]["tested"] == "checkpoints/best.ckpt"
    kills = sorted(moments.iterdir())
    assert len(kills) >= 8
    for kill in kills:
        shutil.rmtree(run_dir)
        shutil.copytree(kill, run_dir)
        assert record(run_dir)["status"] == "running"
        api.train(command)
        assert_same_outcome(run_dir, expected, f"killed after checkpoint write {kill.name}")

    for step, validation_batch, saved in sigterms:
        shutil.rmtree(run_dir)
        StopAt.moment = (step, validation_batch)
        with pytest.raises(SystemExit) as stop:
            api.train(command)
        assert stop.value.code == 128 + signal.SIGTERM and record(run_dir)["status"] == "interrupted"
        assert (run_dir / "checkpoints" / "interrupted.ckpt").exists() == saved
        api.train(command)
        assert_same_outcome(run_dir, expected, f"stopped by SIGTERM at {step, validation_batch}")


# --- real processes, stopped from outside ---


def wait_for(condition, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None, "the run ended before the moment the test waits for"
        assert time.time() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_run_killed_from_outside_resumes_to_the_same_end_and_eval_tests_the_same_model(
    here: list[str], tmp_path: Path, data_dir: Path
):
    # 30 epochs, about 5 s of training: still running when the kill comes, up to 2 s after its first save.
    common = [*EXACT, *STEP_SAVES, "trainer.max_epochs=30", "callbacks.early_stopping=null"]
    common += ["data.random_shift=1"]
    # A schedule sized by the run's length, which makes Lightning build the loader before it resumes.
    common += ["model/scheduler=warmup_cosine", "model.scheduler.warmup_steps=5"]  # [part: pretrained]
    reference = api.train([*here, *common, "run_name=straight"]).run_dir

    run = start_cli(
        "train", *common, "run_name=killed", log_dir=tmp_path, data_dir=data_dir, output=tmp_path / "run.out"
    )
    killed = tmp_path / "train" / "runs" / "killed"
    wait_for(lambda: any((killed / "checkpoints").glob("*.ckpt")), run)
    time.sleep(random.uniform(0, 2))  # wherever the run then is: the test does not choose
    assert run.poll() is None, "the run ended before the kill"
    run.send_signal(signal.SIGKILL)  # no handler, no last words
    run.wait()
    assert record(killed)["status"] == "running"  # it never got to say otherwise
    left = {
        path.name: load_checkpoint(path)["global_step"] for path in (killed / "checkpoints").glob("*.ckpt")
    }

    api.train([*here, *common, "run_name=killed"])  # the same command again
    assert_same_outcome(killed, outcome(reference), f"killed with {left}")
    # What `python src/eval.py run_dir=...` then reports: the test metrics the run recorded, of the same model.
    evaluation = api.evaluate([*here, f"run_dir={killed}"])
    assert evaluation.metrics["test/acc"] == record(reference)["final_metrics"]["test/acc"]
    assert record(evaluation.run_dir)["tested_checkpoint"] == str(killed / "checkpoints" / "best.ckpt")


@pytest.mark.slow
def test_a_kill_while_saving_leaves_the_last_checkpoint_and_sigterm_saves_and_exits_143(
    tmp_path: Path, data_dir: Path
):
    # A wide MLP, so that writing its checkpoint (weights + Adam state, ~200 MB) takes a moment to hit.
    command = ["train", "data=digits", "model/net=mlp", "model.net.hidden_sizes=[4096,2048]", "run_name=big"]
    command += ["trainer.max_epochs=20", "callbacks.last_checkpoint.every_n_train_steps=3"]
    run_dir, out = tmp_path / "train" / "runs" / "big", tmp_path / "run.out"
    last = run_dir / "checkpoints" / "last.ckpt"

    run = start_cli(*command, log_dir=tmp_path, data_dir=data_dir, output=out)
    wait_for(lambda: last.exists() and any(last.parent.glob(".last.ckpt.*.tmp")), run)
    run.send_signal(signal.SIGKILL)  # while the next last.ckpt is being written
    run.wait()
    (partial,) = last.parent.glob(".last.ckpt.*.tmp")
    checkpoint = load_checkpoint(last)  # the previous one, complete
    assert checkpoint["global_step"] >= 3 and "optimizer_states" in checkpoint

    written = last.stat().st_mtime_ns
    run = start_cli(*command, log_dir=tmp_path, data_dir=data_dir, output=out)  # the same command again
    wait_for(lambda: last.stat().st_mtime_ns != written, run)  # it continued from there, and saved again
    run.send_signal(signal.SIGTERM)  # what a cluster sends before it takes the machine back
    assert run.wait(timeout=120) == 128 + signal.SIGTERM
    assert f"Resuming run big (stopped running) from {last}" in (run_dir / "train.log").read_text()
    assert not partial.exists()  # what the cut-short write left was removed first
    assert record(run_dir)["status"] == "interrupted"
    # Resumed from, it goes on from there (test_a_run_killed_or_stopped_at_any_moment...).
    assert (
        load_checkpoint(run_dir / "checkpoints" / "interrupted.ckpt")["global_step"]
        > checkpoint["global_step"]
    )
