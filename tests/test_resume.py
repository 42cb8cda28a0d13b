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
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from omegaconf import OmegaConf, open_dict

from src import api
from src.callbacks.interrupt_checkpoint import InterruptCheckpoint
from src.run.checkpoints import AtomicCheckpointIO, load_checkpoint
from src.run.resume import plan_resume
from tests.conftest import ROOT, paths, run_cli, start_cli, wandb_records
from tests.helpers import StopAt

# Digits + MLP, 2 epochs of 21 steps, every random choice seeded and deterministic.
EXACT = ["data=digits", "model/net=mlp", "trainer.max_epochs=2", "trainer.deterministic=true"]
INTERRUPTIBLE = "+callbacks.interrupt._target_=tests.helpers.InterruptAtStep"
WITH_TESTS = {"PYTHONPATH": str(ROOT)}  # so Hydra can load tests.helpers


def run_dir_of(log_dir: Path, name: str, task: str = "train") -> Path:
    return log_dir / task / "runs" / name


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(checkpoint)["state_dict"]


@pytest.mark.slow
def test_a_named_run_continues_exactly_where_it_was_interrupted(tmp_path: Path, data_dir: Path):
    common = [
        *EXACT,
        INTERRUPTIBLE,
        "logger=wandb",
        "logger.wandb.offline=true",
        "data.random_shift=1",
    ]  # augmentation draws random numbers
    first = run_cli(
        "train",
        "run_name=exp",
        *common,
        log_dir=tmp_path,
        data_dir=data_dir,
        env=WITH_TESTS | {"INTERRUPT_AT_STEP": "30"},
    )
    assert first.returncode != 0  # Ctrl+C in the middle of epoch 1
    run_dir = run_dir_of(tmp_path, "exp")
    assert record(run_dir)["status"] == "interrupted"
    assert load_checkpoint(run_dir / "checkpoints" / "interrupted.ckpt")["global_step"] == 30

    second = run_cli("train", "run_name=exp", *common, log_dir=tmp_path, data_dir=data_dir, env=WITH_TESTS)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Resuming run exp (stopped interrupted)" in second.stdout + second.stderr
    resumed = record(run_dir)
    assert resumed["status"] == "completed" and resumed["resumed"]["previous"]["status"] == "interrupted"
    assert resumed["resumed"]["checkpoint"].endswith("interrupted.ckpt")
    run_ids = {
        r.run.run_id
        for path in run_dir.glob("wandb/offline-run-*/run-*.wandb")
        for r in wandb_records(path)
        if r.WhichOneof("record_type") == "run"
    }
    assert (
        len(run_ids) == 1 and len(list(run_dir.glob("wandb/offline-run-*"))) == 2
    )  # one wandb run, continued

    straight = run_cli(
        "train", "run_name=straight", *common, log_dir=tmp_path, data_dir=data_dir, env=WITH_TESTS
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    uninterrupted = run_dir_of(tmp_path, "straight")
    a, b = (
        weights(run_dir / "checkpoints" / "last.ckpt"),
        weights(uninterrupted / "checkpoints" / "last.ckpt"),
    )
    assert all(torch.equal(a[name], b[name]) for name in b)  # bit-identical

    # Every metric too, but for timings (perf/) and the lr monitor's, which logs at epoch starts: a run
    # resumed mid-epoch does not replay that start.
    def results(metrics: dict) -> dict:
        return {k: v for k, v in metrics.items() if not k.startswith(("lr-", "perf/"))}

    assert results(resumed["final_metrics"]) == results(record(uninterrupted)["final_metrics"])


def test_a_finished_run_is_not_reused_and_resume_never_starts_beside_it(here: list[str], tmp_path: Path):
    api.train([*here, "debug=fdr", "run_name=done"])
    with pytest.raises(
        FileExistsError, match=r"run done \(.*already finished on .*resume=never \(it becomes done-2\) or"
    ):
        api.train([*here, "debug=fdr", "run_name=done"])
    fresh = api.train([*here, "debug=fdr", "run_name=done", "resume=never"])
    assert (
        fresh.run_dir == run_dir_of(tmp_path, "done-2", "debug")
        and record(fresh.run_dir)["status"] == "completed"
    )
    assert record(run_dir_of(tmp_path, "done", "debug"))["status"] == "completed"  # the first is untouched


def test_a_run_is_not_continued_with_another_config_and_keeps_its_snapshot(here: list[str], tmp_path: Path):
    common = [*here, "debug=limit", "data=digits", "model/net=mlp", "run_name=tuned"]
    StopAt.moment = (3, None)  # SIGTERM after step 3, as a cluster's preemption
    with pytest.raises(SystemExit):
        api.train([*common, "+callbacks.stop._target_=tests.helpers.StopAt"])
    run_dir = run_dir_of(tmp_path, "tuned", "debug")
    snapshot = (run_dir / ".hydra" / "config.yaml").read_text()

    changed = r"run tuned was started with another config \(model.optimizer.lr: 0.001 -> 0.5"
    with pytest.raises(ValueError, match=changed):
        api.train([*common, "+callbacks.stop._target_=tests.helpers.StopAt", "model.optimizer.lr=0.5"])
    assert (run_dir / ".hydra" / "config.yaml").read_text() == snapshot  # the first snapshot is kept
    assert len(list((run_dir / ".hydra" / "attempts").iterdir())) == 1  # the refused attempt's, beside it
    assert record(run_dir)["status"] == "interrupted"  # and the record is the first attempt's


@pytest.mark.parametrize("value", ["sometimes", "yes"])
def test_an_unknown_resume_mode_is_refused(compose_cfg, value):
    with pytest.raises(ValueError, match=rf"resume={value} is not valid; choose auto .* or never"):
        plan_resume(compose_cfg("train", [f"resume={value}"]))


def test_a_run_name_with_a_path_in_it_is_refused(here: list[str]):
    with pytest.raises(ValueError, match=r"run_name='../elsewhere' is not a valid directory name"):
        api.train([*here, "run_name=../elsewhere"])


def test_eval_run_dir_tests_the_checkpoint_the_run_tested_whatever_its_name(compose_cfg, tmp_path: Path):
    from src.tasks import evaluate, train

    overrides = [*EXACT, *QUIET, "callbacks.model_checkpoint.filename='epoch_{epoch:03d}'"]
    trained = train(compose_cfg("train", overrides))  # into tmp_path
    tested = record(tmp_path)["tested_checkpoint"]
    assert tested.startswith("checkpoints/epoch_") and (tmp_path / tested).is_file()
    cfg = compose_cfg("eval", [f"run_dir={tmp_path}", "extras.print_config=false"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "eval")
    assert evaluate(cfg)["test/acc"] == trained["test/acc"]
    assert record(tmp_path / "eval")["tested_checkpoint"] == str(tmp_path / tested)


# --- checkpoints: atomic writes, safe loading ---


class _FailsHalfway:
    """Pickles into an error, after the tensors before it were already written."""

    def __reduce__(self):
        raise OSError("disk full (simulated)")


@pytest.mark.parametrize(("min_seconds", "saved_epochs"), [(0, [0, 1, 2]), (3600, [0, 2])])
def test_short_epochs_skip_their_latest_state_save_but_never_the_last_one(
    compose_cfg, monkeypatch: pytest.MonkeyPatch, min_seconds: float, saved_epochs: list[int]
):
    import lightning as L
    from hydra.utils import instantiate

    from src.callbacks.last_checkpoint import LastCheckpoint

    cfg = compose_cfg("train", ["data=digits", "model/net=mlp"])
    saved = []
    monkeypatch.setattr(
        L.Trainer, "save_checkpoint", lambda trainer, *a, **k: saved.append(trainer.current_epoch)
    )
    latest = LastCheckpoint(cfg.paths.output_dir, min_seconds_between=min_seconds)
    trainer = L.Trainer(
        max_epochs=3, limit_train_batches=2, limit_val_batches=1, callbacks=[latest], logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(instantiate(cfg.model), datamodule=instantiate(cfg.data, _convert_="all"))
    assert saved == saved_epochs


def test_a_checkpoint_write_that_fails_halfway_leaves_the_previous_one(tmp_path: Path):
    target = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, target)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(1_000_000)}, "bad": _FailsHalfway()}, target)
    assert torch.equal(load_checkpoint(target)["state_dict"]["w"], torch.ones(3))  # the old one, intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temporary left behind


def test_the_trainer_writes_checkpoints_atomically(compose_cfg):
    from hydra.utils import instantiate

    trainer = instantiate(compose_cfg("train").trainer)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


class _Payload:
    """What an attacker puts in a checkpoint: unpickling it runs a command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("script", ["eval", "train"])
def test_a_checkpoint_with_a_pickle_payload_is_refused_and_never_runs(
    tmp_path: Path, data_dir: Path, script: str
):
    marker, checkpoint = tmp_path / "pwned", tmp_path / "model.ckpt"
    torch.save({"state_dict": {}, "extra": _Payload(marker)}, checkpoint)
    task = {"train": api.train, "eval": api.evaluate}[script]
    refused = re.escape(
        f"ckpt_path={checkpoint} holds Python objects that are not plain data, so it was not loaded"
    )
    with pytest.raises(ValueError, match=refused):
        task([*paths(tmp_path, data_dir), "data=digits", "model/net=mlp", f"ckpt_path={checkpoint}"])
    assert not marker.exists()  # the payload did not run


# --- a run stopped at any moment ends as if it had never stopped ---

# The best checkpoint judged every 7 steps and the latest state saved every 3, on EXACT's 21 steps an epoch:
# saves of both kinds on the same steps, on epochs' last batches (before their validation) and in between.
STEP_SAVES = [
    "callbacks.model_checkpoint.every_n_train_steps=7",
    "callbacks.last_checkpoint.every_n_train_steps=3",
]
QUIET = ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false", "extras.print_config=false"]


def outcome(run_dir: Path, left_out: tuple[str, ...] = ()) -> dict:
    """What a user reads of a finished run: its checkpoint files, its best checkpoint (step and weights),
    its final weights, and its record's metrics and the checkpoint they were tested on. Left out: timings
    (perf/), the learning rate (logged at epoch starts, which a run resumed mid-epoch does not replay) and
    the metrics named by the prefixes in `left_out`."""
    files = sorted(path.name for path in (run_dir / "checkpoints").iterdir())
    best, last = (
        load_checkpoint(run_dir / "checkpoints" / name) if name in files else {}
        for name in ("best.ckpt", "last.ckpt")
    )
    ran = record(run_dir)
    return {
        "files": files,
        "best step": best.get("global_step"),
        "best": best.get("state_dict", {}),
        "last": last.get("state_dict", {}),
        "metrics": {
            k: v for k, v in ran["final_metrics"].items() if not k.startswith(("lr-", "perf/", *left_out))
        },
        "tested": ran["tested_checkpoint"],
    }


def assert_same_outcome(got: dict, expected: dict, moment: str) -> None:
    for key, value in expected.items():
        if key in ("best", "last"):  # weights
            same = got[key].keys() == value.keys() and all(torch.equal(got[key][n], value[n]) for n in value)
        else:
            same = got[key] == value
        assert same, f"{moment}: {key} differs from the run that never stopped" + (
            "" if isinstance(value, dict) else f" ({got[key]} != {value})"
        )


def assert_any_kill_resumes_exactly(compose_cfg, tmp_path: Path, overrides: list[str]) -> None:
    """Train a named run once, keeping a copy of its files after every checkpoint write; then for each copy
    (each state a kill can leave), put it back and run the same config again: every run ends as the first."""
    from src.tasks import evaluate, train

    run_dir, moments = tmp_path / "run", tmp_path / "moments"

    def config():
        cfg = compose_cfg("train", [*overrides, *QUIET, "run_name=any"])
        with open_dict(cfg):
            cfg.paths.output_dir = str(run_dir)
            cfg.trainer.plugins = [{"_target_": "tests.helpers.SnapshotCheckpointIO", "folder": str(moments)}]
        return cfg

    train(config())
    expected = outcome(run_dir)
    assert expected["files"] == ["best.ckpt", "last.ckpt"] and expected["tested"] == "checkpoints/best.ckpt"
    kills = sorted(moments.iterdir())
    for kill in kills:
        shutil.rmtree(run_dir)
        shutil.copytree(kill, run_dir)
        assert record(run_dir)["status"] == "running"
        train(config())
        assert_same_outcome(outcome(run_dir), expected, f"killed after checkpoint write {kill.name}")
    assert len(kills) >= 8
    # What eval run_dir= reports of the last of them: the test metrics the run recorded.
    cfg = compose_cfg("eval", [f"run_dir={run_dir}", "extras.print_config=false"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "eval")
    assert evaluate(cfg)["test/acc"] == expected["metrics"]["test/acc"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "saves",
    [
        STEP_SAVES,
        [
            "+trainer.val_check_interval=0.5",
            *STEP_SAVES[:1],
            "callbacks.last_checkpoint.every_n_train_steps=5",
        ],
    ],
    ids=["step saves", "step saves and validation twice an epoch"],
)
def test_a_run_killed_at_any_moment_and_run_again_ends_as_if_it_never_stopped(
    compose_cfg, tmp_path: Path, saves: list[str]
):
    # The second: a step's save of the best checkpoint before a validation waits for it, and the run
    # resumed from a checkpoint written meanwhile saves it too.
    overrides = [*EXACT, *saves, "model.net.dropout=0.2", "data.random_shift=1"]  # both draw random numbers
    assert_any_kill_resumes_exactly(compose_cfg, tmp_path, overrides)


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_at_any_moment_continues_as_if_it_never_stopped(compose_cfg, tmp_path: Path):
    from src.tasks import train

    def config(name: str):
        overrides = [
            *EXACT,
            *STEP_SAVES,
            *QUIET,
            f"run_name={name}",
            "+callbacks.stop._target_=tests.helpers.StopAt",
        ]
        cfg = compose_cfg("train", overrides)
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path / name)
        return cfg

    train(config("straight"))
    expected = outcome(tmp_path / "straight")
    for step, validation_batch, saved in [
        (10, None, "interrupted.ckpt"),  # mid-epoch
        (21, None, None),  # after an epoch's last step: stopped in the validation that follows it
        (21, 2, None),  # in the middle of that validation
        (41, None, "interrupted.ckpt"),  # the step before an epoch's last
    ]:
        name = f"stopped-{step}-{validation_batch}"
        StopAt.moment = (step, validation_batch)
        with pytest.raises(SystemExit) as stop:
            train(config(name))
        assert stop.value.code == 128 + signal.SIGTERM and record(tmp_path / name)["status"] == "interrupted"
        # In a validation Lightning could not continue, no interrupted.ckpt: the run continues from before it.
        assert (tmp_path / name / "checkpoints" / "interrupted.ckpt").exists() == (saved is not None)
        train(config(name))
        assert_same_outcome(outcome(tmp_path / name), expected, f"stopped at {name}")


# --- slow: real kills ---


def wait_for(condition, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None, "the run ended before the moment the test waits for"
        assert time.time() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_run_killed_from_outside_resumes_to_the_same_end_and_eval_tests_the_same_model(
    tmp_path: Path, data_dir: Path
):
    # 30 epochs, about 5 s of training: still running when the kill comes, up to 2 s after its first save.
    common = [
        *EXACT,
        *STEP_SAVES,
        "trainer.max_epochs=30",
        "callbacks.early_stopping=null",
        "data.random_shift=1",
    ]
    # A schedule sized by the run's length, which makes Lightning build the loader before it resumes.
    common += ["model/scheduler=warmup_cosine", "model.scheduler.warmup_steps=5"]  # [part: pretrained]
    reference = api.train([*paths(tmp_path, data_dir), *common, "run_name=straight"]).run_dir

    run = start_cli(
        "train", *common, "run_name=killed", log_dir=tmp_path, data_dir=data_dir, output=tmp_path / "run.out"
    )
    killed = run_dir_of(tmp_path, "killed")
    wait_for(lambda: any((killed / "checkpoints").glob("*.ckpt")), run)
    time.sleep(random.uniform(0, 2))  # wherever the run then is: the test does not choose
    assert run.poll() is None, "the run ended before the kill"
    run.send_signal(signal.SIGKILL)  # no handler, no last words
    run.wait()
    assert record(killed)["status"] == "running"  # it never got to say otherwise
    left = {
        path.name: load_checkpoint(path)["global_step"] for path in (killed / "checkpoints").glob("*.ckpt")
    }

    api.train([*paths(tmp_path, data_dir), *common, "run_name=killed"])  # the same command again
    assert_same_outcome(outcome(killed), outcome(reference), f"killed with {left}")
    # What eval reports for each run: the test metrics the run recorded, of the same checkpoint.
    for run_dir in (killed, reference):
        evaluation = record(api.evaluate([*paths(tmp_path, data_dir), f"run_dir={run_dir}"]).run_dir)
        assert evaluation["final_metrics"]["test/acc"] == record(reference)["final_metrics"]["test/acc"]
        assert evaluation["tested_checkpoint"] == str(run_dir / "checkpoints" / "best.ckpt")


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_exits_143_and_the_run_resumes_from_it(tmp_path: Path, data_dir: Path):
    common = [
        "data=digits",
        "model/net=mlp",
        "trainer.max_epochs=20",  # still training when SIGTERM comes after the first epoch
        "callbacks.early_stopping=null",
        "run_name=preempted",
    ]
    run = start_cli("train", *common, log_dir=tmp_path, data_dir=data_dir, output=tmp_path / "run.out")
    run_dir = run_dir_of(tmp_path, "preempted")
    wait_for(lambda: (run_dir / "checkpoints" / "last.ckpt").exists(), run)  # a few epochs in
    run.send_signal(signal.SIGTERM)  # what a cluster sends before it takes the machine back
    assert run.wait(timeout=120) == 128 + signal.SIGTERM
    assert record(run_dir)["status"] == "interrupted"
    saved = load_checkpoint(run_dir / "checkpoints" / "interrupted.ckpt")["global_step"]

    api.train([*paths(tmp_path, data_dir), *common])  # the same command again
    assert f"Restoring states from the checkpoint path at {run_dir / 'checkpoints' / 'interrupted.ckpt'}" in (
        (run_dir / "train.log").read_text()
    )
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 20 * 21 > saved


@pytest.mark.slow
def test_a_kill_while_saving_leaves_a_loadable_last_checkpoint(tmp_path: Path, data_dir: Path):
    # A wide MLP, so that writing its checkpoint (weights + Adam state, ~200 MB) takes a moment to hit.
    common = ["data=digits", "model/net=mlp", "model.net.hidden_sizes=[4096,2048]", "trainer.max_epochs=20"]
    common += [
        "callbacks.last_checkpoint.every_n_train_steps=3",
        "callbacks.early_stopping=null",
        "run_name=big",
    ]
    run = start_cli("train", *common, log_dir=tmp_path, data_dir=data_dir, output=tmp_path / "run.out")
    checkpoints = run_dir_of(tmp_path, "big") / "checkpoints"
    wait_for(lambda: (checkpoints / "last.ckpt").exists() and any(checkpoints.glob(".last.ckpt.*.tmp")), run)
    run.send_signal(signal.SIGKILL)  # while the next last.ckpt is being written
    run.wait()
    checkpoint = load_checkpoint(checkpoints / "last.ckpt")  # the previous one, complete
    assert checkpoint["global_step"] >= 3 and "optimizer_states" in checkpoint
    # The same command again continues from it, and first removes what the cut-short write left.
    (partial,) = checkpoints.glob(".last.ckpt.*.tmp")
    resume = plan_resume(OmegaConf.create(record(checkpoints.parent)["config"]))  # the run's own config
    assert resume.checkpoint == checkpoints / "last.ckpt" and not partial.exists()


def test_a_new_fit_never_picks_up_a_last_checkpoint_it_was_not_given(tmp_path: Path):
    # Lightning resumes `fit(ckpt_path=None)` from the newest last*.ckpt of the checkpoint folders when an
    # OnExceptionCheckpoint is among the callbacks; the interrupt checkpoint is not one, so which checkpoint
    # a run continues from stays src/run/resume.py's decision.
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
