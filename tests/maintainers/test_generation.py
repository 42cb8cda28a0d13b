"""Project generation, the maintainers' side: copier makes projects with the defaults and with other answers,
each installs and passes its own checks, copier update brings template changes, and scripts/new_project.py
refuses bad answers. No generated project keeps this file (tests/maintainers/ is the template's upkeep)."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.test_project import BIN, assert_commands_are_the_projects_own, tracked_files

# --- project generation (copier) --------------------------------------------------------------------------

# In a project generated from the template, copier.yml is gone: these tests belong to the template.
TEMPLATE_ONLY = pytest.mark.skipif(
    not (ROOT / "copier.yml").exists(), reason="a generated project has no copier.yml to generate from"
)


def copier(template: Path, dest: Path, *answers: str) -> None:
    data = [arg for answer in answers for arg in ("--data", answer)]
    command = [BIN / "copier", "copy", "--trust", "--defaults", "--vcs-ref", "HEAD", *data, template, dest]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repo as a user's clone of it holds it: its committed files, plus the working tree's changes."""
    clone = tmp_path_factory.mktemp("template") / "repo"
    subprocess.run(["git", "clone", "--quiet", ROOT, clone], check=True)
    for name in tracked_files():  # uncommitted work too, so the test checks what is here
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, clone / name)
    for name in subprocess.run(
        ["git", "ls-files", "--deleted"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines():
        (clone / name).unlink(missing_ok=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=clone, check=True)
    subprocess.run(
        [*git, "commit", "--quiet", "--allow-empty", "-m", "work in progress"], cwd=clone, check=True
    )
    return clone


@TEMPLATE_ONLY
@pytest.mark.slow
@pytest.mark.matrix  # a maintainers' check: make test-parts (CI) runs it  [part: template]
def test_a_project_generated_with_the_defaults_keeps_every_part(template: Path, tmp_path: Path):
    project = tmp_path / "my-project"
    copier(template, project)
    assert 'name = "my-project"' in (project / "pyproject.toml").read_text()
    assert (project / "README.md").read_text().startswith("# my-project\n")
    assert (project / "src" / "data" / "image_folder_datamodule.py").exists()
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    parts = list(yaml.safe_load((template / "scripts" / "parts.yaml").read_text()))
    assert answers["parts"] == parts and answers["loggers"] == ["csv"]  # what copier update reuses
    assert not (project / "copier.yml").exists() and not (project / ".venv").exists()
    # The user-facing docs come along (tutorial, how-tos, reference), the maintainers' notes do not.
    pages = sorted(page.name for page in (template / "docs").glob("*.md"))
    assert "tutorial.md" in pages and sorted(page.name for page in (project / "docs").glob("*.md")) == pages
    assert not (project / "docs" / "maintainers").exists()
    # That it installs and runs is the next test's (in a venv of its own, with its own commands).


# What the parts are called: none of it may be left in a project generated without them (the core alone).
PART_NAMES = re.compile(
    r"image_folder|mnist_images|finetune_images|example_images|ImageFolderDataModule|MNISTDataModule|data=mnist\b"
    r"|segment_digits|digit_scenes|SegmenterModule|model=segmenter|model/net=(unet|lraspp|timm|torchvision)\b"
    r"|warmup_cosine|lr_finder|callbacks\.ema\b|default,ema\b|src/callbacks/ema\.py"
    r"|src/predict\.py|src/export\.py|format=onnx|src/report\.py|report\.md"
    r"|hparams_search=|[Oo]ptuna|[Pp]ostgre|hydra/launcher=slurm|submitit|logger=mlflow|MLflow"
    r"|prediction_pictures|segmentation_pictures|histograms"
    r"|\bsegmenter\b|\bunet\b|segment_run|SMALL_SCENES|test_mlflow"
)


def project_venv(project: Path, venv: Path) -> Path:
    """A venv of the project's own: a fresh interpreter, with the pip its Makefile installs, in which pip
    resolves what the project's `make test` would install, from its files alone (--dry-run: the 6 GB are not
    installed again); then the project itself, editable (its distribution and commands), on top of this
    venv's packages, which a .pth file lends it. Returns the venv's python."""
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = venv / "bin" / "python"
    makefile = (project / "Makefile").read_text()
    pip = re.search(r"^PIP_VERSION := (\S+)$", makefile, flags=re.M)[1]
    # The Makefile's TEST_EXTRAS: every extra the project's pyproject.toml has.
    extras = ",".join(
        tomllib.loads((project / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    upgrade = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", f"pip=={pip}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert upgrade.returncode == 0, upgrade.stderr[-3000:]
    resolve = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--dry-run", "--report", venv / "report.json",
         "-e", f".[{extras}]", "-c", "requirements.lock"],
        cwd=project, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resolve.returncode == 0, resolve.stderr[-3000:]
    report = json.loads((venv / "report.json").read_text())
    resolved = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}
    lock = dict(line.split("==") for line in (project / "requirements.lock").read_text().split())
    assert resolved["cell-counting"] == "0.1.0" and "lightning-hydra-starter" not in resolved
    for package in ("torch", "lightning", "deepspeed", "pytest", "copier"):
        assert resolved[package] == lock[package], package

    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # A plain path, not a site dir: the .pth files in it (this repo's own editable `src`) are not read.
    (Path(site) / "lent_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "-e", "."],
        cwd=project, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    for tool in BIN.iterdir():  # the dev tools the tests call from the venv's bin/ (ruff, codespell, ...)
        if not (venv / "bin" / tool.name).exists():
            (venv / "bin" / tool.name).symlink_to(tool)
    return python


@TEMPLATE_ONLY
@pytest.mark.slow
@pytest.mark.matrix  # [part: template]
def test_a_project_generated_with_other_answers_installs_and_passes_its_own_tests(
    template: Path, tmp_path: Path
):
    project = tmp_path / "cell-counting"
    copier(
        template,
        project,
        "project_name=Cell counting",
        "description=Counts cells in microscope images.",
        "author=Ada Lovelace",
        "python_version=3.11",
        "wandb_entity=lab",
        "parts=[]",
        'loggers=["wandb"]',
    )
    subprocess.run(["git", "init", "--quiet"], cwd=project, check=True)
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert (pyproject["name"], pyproject["requires-python"]) == ("cell-counting", ">=3.11")
    assert pyproject["authors"] == [{"name": "Ada Lovelace"}]
    assert_commands_are_the_projects_own(project)
    assert re.search(r"^Copyright \(c\) \d{4} Ada Lovelace$", (project / "LICENSE").read_text(), flags=re.M)
    workflow = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())
    assert workflow["jobs"]["test"]["strategy"]["matrix"]["python"] == ["3.11", "3.12", "3.13"]
    wandb = yaml.safe_load((project / "configs" / "logger" / "wandb.yaml").read_text())["wandb"]
    assert (wandb["project"], wandb["entity"]) == ("cell-counting", "lab")
    assert "  - logger: wandb" in (project / "configs" / "train.yaml").read_text()

    # Its README is its own: what it is, its commands, how to add things; nothing of the template's upkeep.
    readme = (project / "README.md").read_text()
    assert readme.startswith("# Cell counting\n\nCounts cells in microscope images.\n")
    assert "make train" in readme and "cell-counting-train" in readme and "## Add your own" in readme
    assert "(docs/tutorial.md)" in readme  # its docs, which tests/maintainers/test_docs.py checks there too
    for template_matter in (
        "copier copy",
        "Start your own project",
        "make bench",
        "{{",
        "<!--",
        "lightning-hydra-starter",
        "project template",
    ):
        assert template_matter not in readme, template_matter
    assert not (project / "scripts" / "project_readme.md").exists()
    # Without the parts nothing names them: no file, no README or docs line, no config comment.
    for example in ("src/data/image_folder_datamodule.py", "configs/data/mnist.yaml", "src/predict.py"):
        assert not (project / example).exists()
    pages = [project / "README.md", *sorted(project.glob("docs/**/*.md"))]
    named = [
        f"{path.relative_to(project)}:{number}: {line.strip()}"
        for path in [
            *pages,
            *sorted(project.glob("configs/**/*.yaml")),
            *project.glob("src/**/*.py"),
            *project.glob("tests/**/*.py"),
        ]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PART_NAMES.search(line) or "<!--" in line or "docs/maintainers" in line
    ]
    assert not named, "\n".join(named)
    assert not (project / "docs" / "maintainers").exists()

    python = project_venv(project, tmp_path / "venv")
    # The core alone installs none of what only a part needs.
    report = json.loads((tmp_path / "venv" / "report.json").read_text())
    resolved = {item["metadata"]["name"].lower() for item in report["install"]}
    for package in ("optuna", "timm", "mlflow-skinny", "onnxruntime", "psycopg", "hydra-submitit-launcher"):
        assert package not in resolved, package
    # Its own fast tests of what generation changes (configs, code style, tooling, commands, README and docs),
    # in its own venv; all of them (`make test-fast`) take minutes, too long inside this suite. Then its CLI.
    # The maintainers' checks, which no project keeps, are run on it from here: its docs, layering, public API
    # and code style as generation left them.
    shutil.copytree(template / "tests" / "maintainers", project / "tests" / "maintainers")
    own = [
        "tests/test_configs.py",
        "tests/test_project.py",
        "tests/maintainers/test_code_quality.py",
        "tests/maintainers/test_docs.py",
        "tests/maintainers/test_layout.py",
        "tests/maintainers/test_public_api.py",
    ]
    # Its docs' commands compose in the template (tests/maintainers/test_docs.py); here the paths, links and options they
    # name are checked against what generation left, which is where leaving out the parts could break them.
    skip = ["-k", "not test_every_command_composes"]
    tests = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow", *skip, *own],
        cwd=project, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-5000:]
    assert re.search(r"\d+ passed", tests.stdout)
    # The README's smoke test, with the project's own command (wandb, its default logger, offline: no login).
    fdr = subprocess.run(
        [python.parent / "cell-counting-train", "debug=fdr", "logger.wandb.offline=true"],
        cwd=project, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert fdr.returncode == 0, fdr.stderr[-3000:]
    run = next((project / "logs" / "debug" / "runs").iterdir())
    assert json.loads((run / "run.json").read_text())["status"] == "completed"


@TEMPLATE_ONLY
@pytest.mark.slow
@pytest.mark.matrix  # [part: template]
def test_copier_update_brings_template_changes_and_keeps_the_projects_readme(template: Path, tmp_path: Path):
    git = ["git", "-c", "user.name=u", "-c", "user.email=u@u"]
    newer = tmp_path / "template"  # the template, later: a clone with one more commit
    subprocess.run(["git", "clone", "--quiet", template, newer], check=True)
    project = tmp_path / "cells"
    copier(newer, project, "project_name=Cell counting", "parts=[segmentation]")
    subprocess.run(["git", "init", "--quiet"], cwd=project, check=True)
    subprocess.run([*git, "add", "-A"], cwd=project, check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "start"], cwd=project, check=True)
    with open(project / "README.md", "a") as readme:
        readme.write("Our lab's notes.\n")
    subprocess.run([*git, "commit", "--quiet", "-am", "our README"], cwd=project, check=True)
    with open(newer / "Makefile", "a") as makefile:
        makefile.write("# a later template change\n")
    subprocess.run([*git, "commit", "--quiet", "-am", "template change"], cwd=newer, check=True)

    update = subprocess.run(
        [BIN / "copier", "update", "--trust", "--defaults"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert update.returncode == 0, update.stdout + update.stderr
    assert (project / "Makefile").read_text().endswith("# a later template change\n")
    readme = (project / "README.md").read_text()
    assert readme.startswith("# Cell counting\n") and readme.endswith("Our lab's notes.\n")
    assert not (project / "scripts" / "project_readme.md").exists()

    # A part left out at first comes in later with the same command (docs/tutorial.md, "day one").
    subprocess.run([*git, "commit", "--quiet", "-am", "updated"], cwd=project, check=True)
    assert not (project / "src" / "predict.py").exists()
    add = subprocess.run(
        [BIN / "copier", "update", "--trust", "--defaults", "--data", 'parts=["segmentation","predict"]'],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert add.returncode == 0, add.stdout + add.stderr
    assert (project / "src" / "predict.py").exists() and (project / "src" / "inference" / "tasks.py").exists()
    assert (project / "src" / "inference" / "segmentation_predictions.py").exists()  # with segmentation
    assert "def prediction_writer(" in (project / "src" / "models" / "classifier_module.py").read_text()
    assert "-predict = " in (project / "pyproject.toml").read_text()
    assert (project / "README.md").read_text().endswith("Our lab's notes.\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--name", "x", "--loggers", "csv,neptune"],
            "--loggers: neptune is not a logger; choose from csv, ",
        ),
        (
            ["--name", "x", "--python", "3.10"],
            "--python 3.10 is not supported; choose one of 3.11, 3.12, 3.13",
        ),
        (["--name", "!!!"], "--name '!!!' has no letters or digits to name a package with"),
    ],
)
def test_new_project_refuses_bad_answers_before_changing_anything(args: list[str], message: str):
    before = (ROOT / "pyproject.toml").read_text()
    result = subprocess.run(
        [sys.executable, ROOT / "scripts" / "new_project.py", *args], capture_output=True, text=True
    )
    assert result.returncode == 2 and message in result.stderr
    assert (ROOT / "pyproject.toml").read_text() == before


def new_project_in(root: Path, monkeypatch: pytest.MonkeyPatch):
    """scripts/new_project.py as a module, editing the files under `root` instead of this repo's."""
    spec = importlib.util.spec_from_file_location("new_project", ROOT / "scripts" / "new_project.py")
    new_project = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(new_project)
    monkeypatch.setattr(new_project, "ROOT", root)
    return new_project


def test_new_project_drops_the_maintainers_notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for page in ("README.md", "docs/tutorial.md", "docs/maintainers/design.md"):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text(f"# {page}\n")
    new_project = new_project_in(tmp_path, monkeypatch)
    new_project.remove_maintainer_docs()
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.md")) == [
        "README.md",
        "docs/tutorial.md",
    ]


def test_new_project_stops_when_the_template_no_longer_has_what_it_edits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    new_project = new_project_in(tmp_path, monkeypatch)
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "0.1.0"\n')  # no name line
    with pytest.raises(
        SystemExit, match=r"pyproject.toml: found nothing to replace .*has the template changed"
    ):
        new_project.set_project("x", "", "", "3.10")
