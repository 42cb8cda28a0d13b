"""End to end as the README tells users to run it: through src.api, which runs a task as `python src/<task>.py`
does, and through the real command line where the command line itself is what is tested."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from hydra.errors import MissingConfigException

from src import api
from tests.conftest import (
    ONE_BATCH,
    ROOT,
    cli_command,
    last_metrics,
    only_run_dir,
    run_cli,
    run_python,
)

DIGITS_MLP = ["data=digits", "model/net=mlp"]


def test_fast_dev_run_trains_validates_and_tests(tmp_path: Path, data_dir: Path):
    result = run_cli("train", "debug=fdr", log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path, "debug")
    assert (run_dir / ".hydra" / "config.yaml").exists()
    # fast_dev_run turns the loggers off; the run's log file still has the final metrics.
    final = re.search(r"Final metrics: (.*)", (run_dir / "debug.log").read_text()).group(1)
    assert {"test/acc", "val/acc", "train/loss"} <= {item.split("=")[0] for item in final.split(", ")}
    # A new run starts from scratch, without Lightning's warnings about a "last" checkpoint it looked for
    # (warnings reach the console, not the log file: this test runs the command line).
    assert "ckpt_path" not in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_lightnings_messages_reach_the_log_file_when_lightning_was_imported_first(
    tmp_path: Path, data_dir: Path
):
    # A wrapper script (or an entry point edited to import lightning at its top) loads Lightning before Hydra
    # sets up logging; Lightning then gives its loggers a console handler of their own.
    command = cli_command("train", "debug=fdr", log_dir=tmp_path, data_dir=data_dir)
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(
        f"import lightning, runpy, sys\nsys.argv = {command[1:]!r}\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    result = run_python(wrapper)
    assert result.returncode == 0, result.stderr[-3000:]
    log_file = (only_run_dir(tmp_path, "debug") / "debug.log").read_text()
    assert "`Trainer.fit` stopped" in log_file and "`Trainer.fit` stopped" not in result.stderr


def test_runs_from_any_working_directory_with_seed_zero(tmp_path: Path, data_dir: Path):
    result = run_cli(
        "train", "debug=fdr", *DIGITS_MLP, "seed=0", log_dir=tmp_path, data_dir=data_dir, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Seed set to 0" in result.stdout + result.stderr
    assert not (tmp_path / "outputs").exists()  # Hydra's own default dir is not used


def test_a_run_prints_no_warning_a_user_cannot_act_on(tmp_path: Path, data_dir: Path):
    """Lightning's tip to install litlogger and torch's LeafSpec deprecation, which Lightning itself triggers,
    are left out (src/run/extras.py)."""
    result = run_cli(
        "train", *DIGITS_MLP, "trainer.max_epochs=1", *ONE_BATCH[1:], log_dir=tmp_path, data_dir=data_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "litlogger" not in output and "LeafSpec" not in output, output[-3000:]


def test_early_stopping_says_in_one_line_when_and_why_it_ended_training(here: list[str]):
    # min_delta=1: no accuracy improves on the first one by that much, so patience=1 stops after epoch 1.
    stopping = ["callbacks.early_stopping.patience=1", "callbacks.early_stopping.min_delta=1.0"]
    run = api.train([*here, *DIGITS_MLP, "trainer.max_epochs=5", *ONE_BATCH[1:], *stopping])
    log = (run.run_dir / "train.log").read_text()
    said = re.findall(r"Early stopping ended training after epoch (\d+): (.*)", log)
    assert len(said) == 1, log[-3000:]
    assert said[0][0] == "1" and said[0][1].startswith(
        "Monitored metric val/acc did not improve in the last 1"
    )


@pytest.mark.slow
def test_train_then_eval_gives_the_same_test_accuracy(digits_run: Path, here: list[str]):
    # digits_run: `python src/train.py data=digits model/net=mlp trainer.max_epochs=2`, shared by the session
    best = digits_run / "checkpoints" / "best.ckpt"
    assert best.exists() and (digits_run / "checkpoints" / "last.ckpt").exists()
    trained = last_metrics(digits_run)
    assert trained["test/acc"] > 0.8  # 2 epochs of the MLP on digits
    checkpoint = torch.load(best, weights_only=True)  # plain data only: safe to load
    assert checkpoint["hyper_parameters"]["net"]["_target_"] == "src.models.components.mlp.MLP"

    eval_dir = api.evaluate([*here, *DIGITS_MLP, f"ckpt_path={best}"]).run_dir
    assert last_metrics(eval_dir)["test/acc"] == pytest.approx(trained["test/acc"])
    # part: diagnostics
    assert (eval_dir / "pictures" / "test_confusion_matrix.png").exists()  # eval draws the test pictures
    # /part
    assert json.loads((eval_dir / "run.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_example_experiment_trains_well(here: list[str]):
    run = api.train([*here, "experiment=digits_mlp"])
    assert last_metrics(run.run_dir)["test/acc"] > 0.93


def test_unknown_config_option_lists_the_valid_ones(here: list[str]):
    with pytest.raises(MissingConfigException, match=r"Could not find 'model/resnet'") as refused:
        api.train([*here, "model=resnet"])
    assert re.search(r"Available options in 'model':\s+classifier", str(refused.value))


def test_eval_without_checkpoint_says_how_to_give_one(here: list[str]):
    with pytest.raises(ValueError, match=r"eval needs a checkpoint: ckpt_path="):
        api.evaluate(here)


@pytest.mark.parametrize(
    ("kind", "error", "expected"),
    [
        ("missing", FileNotFoundError, "does not exist"),
        ("not_a_checkpoint", ValueError, "is not a checkpoint"),
    ],
)
def test_eval_with_a_bad_checkpoint_path_fails_clearly(
    here: list[str], tmp_path: Path, kind: str, error: type[Exception], expected: str
):
    path = tmp_path / "model.ckpt"
    if kind == "not_a_checkpoint":
        path.write_text("not a checkpoint")
    with pytest.raises(error, match=re.escape(f"ckpt_path={path} {expected}")):
        api.evaluate([*here, f"ckpt_path={path}"])


def test_help_answers_without_training(tmp_path: Path, data_dir: Path):
    result = run_cli("train", "--help", log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode == 0 and "== Config ==" in result.stdout
    assert not (tmp_path / "train").exists()


@pytest.mark.parametrize("task", ["train", "eval"])
def test_console_scripts_find_the_configs_from_any_directory(tmp_path: Path, task: str):
    """`make install` installs <project name>-<task> commands (pyproject.toml's [project.scripts])."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    script = Path(sys.executable).parent / f"{project['name']}-{task}"
    assert project["scripts"][script.name] == f"src.{task}:main"
    result = subprocess.run(
        [script, "--cfg", "job"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"task_name: {task}" in result.stdout


def test_checkpoint_path_that_is_a_directory_is_refused(tmp_path: Path):
    from src.run.checkpoints import check_checkpoint

    with pytest.raises(IsADirectoryError, match=rf"ckpt_path={tmp_path} is a directory"):
        check_checkpoint(str(tmp_path))


def test_a_sharded_fsdp_checkpoint_directory_is_accepted(tmp_path: Path):
    from src.run.checkpoints import check_checkpoint

    sharded = tmp_path / "last.ckpt"  # what trainer=fsdp with state_dict_type=sharded saves
    sharded.mkdir()
    (sharded / "meta.pt").write_bytes(b"")
    assert check_checkpoint(str(sharded)) == sharded


@pytest.mark.slow
def test_compiled_training_saves_checkpoints_that_eval_predict_and_export_load_without_compile(
    here: list[str], here_for_inference: list[str], tmp_path: Path, data_dir: Path
):
    # The compiling runs on the command line: torch.compile's state and its cache directory (an environment
    # variable) would stay in the test process. Whole batches only: a last, smaller batch compiles the graph
    # once more (for dynamic shapes).
    whole_batches = [f"+trainer.limit_{stage}_batches=2" for stage in ("val", "test")]
    compiled = run_cli(
        "train",
        *DIGITS_MLP,
        "trainer.max_epochs=1",
        "+trainer.limit_train_batches=4",
        *whole_batches,
        "model.compile=true",
        "callbacks=[default,throughput]",
        env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},  # a cold, private compile cache
        log_dir=tmp_path,
        data_dir=data_dir,
        timeout=600,
    )
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert list((tmp_path / "inductor").iterdir())  # torch.compile really ran
    run_dir = only_run_dir(tmp_path)
    best = run_dir / "checkpoints" / "best.ckpt"
    names = torch.load(best, weights_only=True)["state_dict"].keys()
    assert not [name for name in names if "_orig_mod" in name]  # the plain net's parameter names

    evaluated = api.evaluate([*here, *DIGITS_MLP, *whole_batches, f"ckpt_path={best}"])
    test_acc = last_metrics(evaluated.run_dir)["test/acc"]
    assert test_acc == pytest.approx(last_metrics(run_dir)["test/acc"])
    assert last_metrics(run_dir)["perf/train_samples_per_sec"] > 0  # the compiling first step left out
    # part: predict
    # The compile-trained run also predicts without compile (predict and export load a run alike).
    predicted = api.predict([*here_for_inference, f"run_dir={run_dir}"]).run_dir
    assert (predicted / "predictions.csv").is_file()
    # /part
    # And with compile on the loading side (the training run left its compiled graphs in the cache).
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    compiled_eval = run_cli(
        "eval",
        *DIGITS_MLP,
        *whole_batches,
        "model.compile=true",
        f"ckpt_path={best}",
        env=cache,
        log_dir=tmp_path / "ce",
        data_dir=data_dir,
    )
    assert compiled_eval.returncode == 0, compiled_eval.stderr[-3000:]
    assert last_metrics(only_run_dir(tmp_path / "ce", "eval"))["test/acc"] == pytest.approx(test_acc)


# Packages only some runs need (each costs a second or more at import): --help, config printing and the default
# run import none of them.
OPTIONAL_IMPORTS = ["wandb", "onnx"]
OPTIONAL_IMPORTS.append("timm")  # [part: pretrained]
# part: text
# Not transformers: `import lightning` imports it when installed (torchmetrics' BERTScore, torchmetrics#2242).
OPTIONAL_IMPORTS += ["peft", "pyarrow", "transformers.models.bert"]
# /part


@pytest.mark.slow
def test_help_config_printing_and_the_default_run_import_no_optional_package(tmp_path: Path, data_dir: Path):
    for overrides in (["--help"], ["--cfg", "job", "logger=wandb"], ["debug=fdr"]):
        command = cli_command("train", *overrides, log_dir=tmp_path, data_dir=data_dir)
        # A wrapper that says which of them were imported before the command (none) and at its exit.
        probe = tmp_path / "probe.py"
        probe.write_text(
            f"import atexit, runpy, sys\nnames = {OPTIONAL_IMPORTS!r}\n"
            "print('before:', [n for n in names if n in sys.modules])\n"
            "atexit.register(lambda: print('imported:', [n for n in names if n in sys.modules]))\n"
            f"sys.argv = {command[1:]!r}\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
        )
        done = run_python(probe, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "before: []" in done.stdout and "imported: []" in done.stdout, (overrides, done.stdout[-500:])
