"""End to end as the README tells users to run it: through src.api, which runs a task as `python src/<task>.py`
does, and through the real command line where the command line itself is what is tested."""

import contextlib
import os
import re
import shlex
import shutil  # [part: predict]
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from hydra.errors import MissingConfigException

from src import api
from tests.conftest import ONE_BATCH, ROOT, cli_env, last_metrics, only_run_dir, paths, run_python

DIGITS_MLP = ["data=digits", "model/net=mlp"]
# Packages only some runs need (each costs a second or more at import): --help, config printing and the default
# run import none of them.
OPTIONAL_IMPORTS = {"wandb", "onnx"}
OPTIONAL_IMPORTS.add("timm")  # [part: pretrained]
# part: text
# Not transformers: `import lightning` imports it when installed (torchmetrics' BERTScore, torchmetrics#2242).
OPTIONAL_IMPORTS |= {"peft", "pyarrow", "transformers.models.bert"}
# /part
LIST_IMPORTS = {"PYTHONPROFILEIMPORTTIME": "1"}  # python names each module it imports on stderr


def split_import_report(stderr: str) -> tuple[set[str], str]:
    """The modules that python's import report (LIST_IMPORTS) names on stderr, and the rest of stderr."""
    modules = set(re.findall(r"^import time:.*\| +(\S+)$", stderr, re.MULTILINE))
    assert modules, "no import report"  # else no check of the imports could fail
    return modules, re.sub(r"^import time:.*\n", "", stderr, flags=re.MULTILINE)


# The README a project has, whose commands the walk below runs (the template's: the one generation gives it).
README = ROOT / "README.md"
README = ROOT / "scripts" / "project_readme.md"  # [part: template]
TWO_BATCHES = [f"++trainer.limit_{stage}_batches=2" for stage in ("train", "val", "test")]


def readme_commands() -> list[str]:
    """The `python src/...` lines of the README's ```bash blocks, in their order, without their comments."""
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    lines = [re.sub(r"\s+#.*", "", line) for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("python src/")]


@pytest.mark.slow
def test_the_readmes_commands_run_one_after_another_as_the_shell_runs_them(
    tmp_path: Path,  # the folder the commands run in: its logs/ and images/
    data_dir: Path,
    digit_files: Path,  # [part: predict]
):
    """Each command of the README in its order, started in another folder: `logs/` and `images/` are that
    folder's, `<run>` its newest training run. The first command of each entry point, and each with a flag
    (`-m`, `--help`), runs in a shell with the project's venv; the others, which differ from it only by their
    overrides, run the same overrides through src.api (this test shows that it gives the command's metrics).
    The walk adds its data folder and, to training runs, a cut to two batches of each stage."""
    commands = readme_commands()
    assert [command for command in commands if command.startswith("python src/eval.py run_dir=")]
    shutil.copytree(digit_files, tmp_path / "images")  # [part: predict]
    venv = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **LIST_IMPORTS}  # as activated
    in_python = {"train": api.train, "eval": api.evaluate}
    in_python |= {"predict": api.predict, "export": api.export}  # [part: predict]
    runs, first, shelled = tmp_path / "logs" / "train" / "runs", None, set()
    for command in commands:
        if "<run>" in command:
            command = command.replace("<run>", max(runs.iterdir()).name)  # names sort by their start time
        task = command.split()[1].removeprefix("src/").removesuffix(".py")
        overrides = shlex.split(command)[2:]
        flagged = any(word.startswith("-") for word in overrides)  # -m, --help: the command line's own
        # The tests' paths and CSV log (predict, export and report choose no logger; a command may choose one).
        csv = task in ("train", "eval") and "logger=" not in command
        added = [o for o in paths(tmp_path / "logs", data_dir) if csv or not o.startswith("logger=")]
        added += TWO_BATCHES if task == "train" else []
        if task in shelled and task in in_python and not flagged:
            with contextlib.chdir(tmp_path):
                in_python[task]([*overrides, *added])
            continue
        if not flagged:
            shelled.add(task)
        line = f"{command.replace('src/', f'{ROOT}/src/', 1)} {shlex.join(added)}"
        done = subprocess.run(
            line, shell=True, cwd=tmp_path, env=cli_env(**venv), capture_output=True, text=True
        )
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        modules, stderr = split_import_report(done.stderr)
        if task in ("train", "eval"):
            assert not modules & OPTIONAL_IMPORTS, command
        if not flagged:
            # No warning a user cannot act on (src/run/extras.py): Lightning's about a "last" checkpoint a new
            # run has not got, or about the training callbacks eval's testing needs no state of; its tip to
            # install litlogger; torch's LeafSpec deprecation.
            assert not re.search("ckpt_path|litlogger|LeafSpec", done.stdout + stderr), command
        if task == "train" and not flagged:
            first = first or (max(runs.iterdir()), [*overrides, *added])  # the run this command made
    assert shelled >= {"train", "eval"} and not (tmp_path / "outputs").exists()  # not Hydra's own default dir

    # The first training command again, from Python with the same overrides: the same test metrics.
    run_dir, overrides = first
    tested = {k: v for k, v in last_metrics(run_dir).items() if k.startswith("test/")}
    again = api.train([*overrides, "run_name=again"]).metrics
    assert {k: v for k, v in again.items() if k.startswith("test/")} == tested


def test_an_installed_command_answers_from_any_directory_without_optional_imports(tmp_path: Path):
    """`make install` installs <project name>-<task> commands (pyproject.toml's [project.scripts]); eval's,
    asked for its config with wandb chosen, answers without running anything or importing wandb."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    script = Path(sys.executable).parent / f"{project['name']}-eval"
    assert project["scripts"][script.name] == "src.eval:main"
    command = [script, "--cfg=job", "logger=wandb", f"paths.log_dir={tmp_path}"]
    env = cli_env(**LIST_IMPORTS)
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ckpt_path:" in result.stdout and "task_name: eval" in result.stdout
    assert not split_import_report(result.stderr)[0] & OPTIONAL_IMPORTS
    assert not list(tmp_path.iterdir())


def test_early_stopping_says_in_one_line_when_and_why_it_ended_training(here: list[str]):
    # min_delta=1: no accuracy improves on the first one by that much, so patience=1 stops after epoch 1.
    stopping = ["callbacks.early_stopping.patience=1", "callbacks.early_stopping.min_delta=1.0"]
    run = api.train([*here, *DIGITS_MLP, "trainer.max_epochs=5", *ONE_BATCH[1:], *stopping])
    log = (run.run_dir / "train.log").read_text()
    (said,) = re.findall(r"Early stopping ended training after epoch (.*)", log)
    assert said.startswith("1: Monitored metric val/acc did not improve in the last 1")


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
    ("make", "error", "says"),
    [
        (lambda path: None, FileNotFoundError, "does not exist"),
        (lambda path: path.write_text("not a checkpoint"), ValueError, "is not a checkpoint"),
        (lambda path: path.mkdir(), IsADirectoryError, "is a directory but not a sharded FSDP checkpoint"),
    ],
    ids=["missing", "not_a_checkpoint", "a_directory"],
)
def test_eval_with_a_bad_checkpoint_path_fails_clearly(
    here: list[str], tmp_path: Path, make, error, says: str
):
    make(path := tmp_path / "model.ckpt")
    with pytest.raises(error, match=re.escape(f"ckpt_path={path} {says}")):
        api.evaluate([*here, f"ckpt_path={path}"])


def test_a_sharded_fsdp_checkpoint_directory_is_accepted(tmp_path: Path):
    from src.run.checkpoints import check_checkpoint

    sharded = tmp_path / "last.ckpt"  # what trainer=fsdp with state_dict_type=sharded saves
    sharded.mkdir()
    (sharded / "meta.pt").write_bytes(b"")
    assert check_checkpoint(str(sharded)) == sharded


@pytest.mark.slow
def test_compiled_training_saves_checkpoints_that_load_with_and_without_compile(
    here: list[str], here_for_inference: list[str], tmp_path: Path
):
    # A process of its own: torch.compile's state and its cache dir (an environment variable) would stay in the
    # test process. Whole batches only: a last, smaller batch compiles the graph once more (dynamic shapes).
    limits = {"train": 4, "val": 2, "test": 2}
    common = [*here, *DIGITS_MLP, *(f"+trainer.limit_{stage}_batches={n}" for stage, n in limits.items())]
    run_dir = tmp_path / "train" / "runs" / "compiled"
    best = run_dir / "checkpoints" / "best.ckpt"
    train = [*common, "trainer.max_epochs=1", "run_name=compiled", "callbacks=[default,throughput]"]
    evaluate = [*common, f"ckpt_path={best}"]
    script = f"from src import api\napi.train({[*train, 'model.compile=true']!r})\n"
    script += f"api.evaluate({[*evaluate, 'model.compile=true']!r})\n"  # from the training's compile cache
    done = run_python("-c", script, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list((tmp_path / "inductor").iterdir())  # torch.compile really ran
    checkpoint = torch.load(best, weights_only=True)  # plain data only: safe to load
    assert checkpoint["hyper_parameters"]["net"]["_target_"] == "src.models.components.mlp.MLP"
    assert not [name for name in checkpoint["state_dict"] if "_orig_mod" in name]  # the plain net's names
    trained = last_metrics(run_dir)
    assert trained["perf/train_samples_per_sec"] > 0  # the compiling first step left out
    assert last_metrics(only_run_dir(tmp_path, "eval"))["test/acc"] == pytest.approx(trained["test/acc"])
    assert api.evaluate(evaluate).metrics["test/acc"] == pytest.approx(trained["test/acc"])  # not compiled
    # A script imports Lightning (src.api does) before the run sets up logging: Lightning's messages still go
    # to the run's log file, not to a console handler of Lightning's own.
    said = "`Trainer.fit` stopped"
    assert said in (run_dir / "train.log").read_text() and said not in done.stderr
    # part: predict
    predicted = api.predict([*here_for_inference, f"run_dir={run_dir}"]).run_dir  # loads as export does
    assert (predicted / "predictions.csv").is_file()
    # /part
