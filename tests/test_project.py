"""Clone it and own it: the pre-commit hooks pass, the Makefile documents itself and cleans safely, the CI
workflow is what the README says, shell completion installs, and copier generates projects that run."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

BIN = Path(sys.executable).parent  # the venv's tools (the dev extra)


def tracked_files() -> list[str]:
    """The files git would commit: tracked plus untracked-but-not-ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


def hook_args(hook_id: str) -> list[str]:
    """The arguments .pre-commit-config.yaml gives a hook, so this test and the hook run alike."""
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    for repo in config["repos"]:
        for hook in repo["hooks"]:
            if hook["id"] == hook_id:
                return hook.get("args", [])
    raise AssertionError(f"no hook {hook_id} in .pre-commit-config.yaml")


def test_every_pre_commit_hook_is_one_this_test_runs():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"] for repo in config["repos"] for hook in repo["hooks"]}
    checked = {"trailing-whitespace", "end-of-file-fixer", "check-yaml", "check-toml"}
    checked |= {"check-added-large-files", "check-merge-conflict", "ruff", "ruff-format", "codespell"}
    assert hooks == checked | {"nbstripout"}


def test_no_trailing_whitespace_and_one_final_newline():
    # What the trailing-whitespace and end-of-file-fixer hooks would fix, checked without changing files.
    bad = []
    for name in tracked_files():
        data = (ROOT / name).read_bytes()
        if b"\0" in data or not data:
            continue  # binary or empty
        lines = data.split(b"\n")
        bad += [
            f"{name}:{i + 1}: trailing whitespace" for i, line in enumerate(lines) if line.rstrip() != line
        ]
        if not data.endswith(b"\n") or data.endswith(b"\n\n"):
            bad.append(f"{name}: must end with exactly one newline")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("hook", "tool", "suffixes"),
    [
        ("check-yaml", "check-yaml", (".yaml", ".yml")),
        ("check-toml", "check-toml", (".toml",)),
        ("check-merge-conflict", "check-merge-conflict", None),
        ("check-added-large-files", "check-added-large-files", None),
        ("codespell", "codespell", None),
    ],
)
def test_the_checking_hooks_pass_on_every_file(hook: str, tool: str, suffixes: tuple[str, ...] | None):
    files = [name for name in tracked_files() if suffixes is None or name.endswith(suffixes)]
    extra = ["--enforce-all"] if hook == "check-added-large-files" else []  # not only files being added
    result = subprocess.run(
        [BIN / tool, *hook_args(hook), *extra, *files], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_committed_notebooks_have_no_outputs():
    notebooks = [name for name in tracked_files() if name.endswith(".ipynb")]
    if notebooks:  # nbstripout --verify fails on any notebook that still holds outputs
        result = subprocess.run(
            [BIN / "nbstripout", "--verify", *notebooks], cwd=ROOT, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
    # The hook's tool is there for when notebooks are added.
    assert (BIN / "nbstripout").exists()


def makefile_targets() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return re.findall(r"^([a-z][a-z-]*):", text, flags=re.M)


def test_make_help_lists_every_target_with_one_line():
    result = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    for target in makefile_targets():
        line = next((line for line in lines if line.split()[:1] == [target]), None)
        assert line is not None and len(line.split()) > 2, f"make help has no line for {target}"


def test_make_installs_again_when_python_or_the_lock_change_and_only_then(tmp_path: Path):
    """`make install LOCK=` or `PYTHON=` after an install must re-install, not be skipped by a fresh stamp;
    `make test`'s install (the extras) counts as the lean one too. A stand-in .venv/bin/python records the
    calls (and answers the version check with the real interpreter)."""
    for name in ("Makefile", "pyproject.toml", "requirements.lock"):
        shutil.copy(ROOT / name, tmp_path / name)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        f'#!/bin/sh\ncase "$2" in *version_info*) exec {sys.executable} "$@";; esac\n'
        f'echo "$@" >> {tmp_path}/calls.log\n'
    )
    python.chmod(0o755)

    def make(*args: str) -> list[str]:
        """The calls of .venv/bin/python that one `make` made."""
        (tmp_path / "calls.log").write_text("")
        result = subprocess.run(["make", *args], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        return (tmp_path / "calls.log").read_text().splitlines()

    # An install brings pip to the Makefile's version, then installs without compiling (Python writes the
    # bytecode of what a run imports, when it first imports it).
    makefile = (ROOT / "Makefile").read_text()
    upgrade = "-m pip install --quiet pip==" + re.search(r"^PIP_VERSION := (\S+)$", makefile, flags=re.M)[1]

    def installs(what: str) -> list[str]:
        return [upgrade, f"-m pip install --no-compile {what}"]

    assert make("install") == installs("-e . -c requirements.lock")
    assert make("install") == []
    assert make("install", "LOCK=") == installs("-e .")
    assert make("install", "LOCK=") == []
    assert make("install") == installs("-e . -c requirements.lock")
    extras = ",".join(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    assert make("install-test") == installs(f"-e .[{extras}] -c requirements.lock")  # every extra
    assert make("install") == []  # the test install holds the lean one
    # Another Python makes .venv anew with it (a stand-in "Python 3.99" that makes stand-in venvs of itself).
    other = tmp_path / "python3.99"
    other.write_text(
        '#!/bin/sh\ncase "$2" in *version_info*) echo "(3, 99)"; exit;; esac\n'
        f'if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin" && cp {other} "$3/bin/python"; exit; fi\n'
        f'echo "$@" >> {tmp_path}/calls.log\n'
    )
    other.chmod(0o755)
    assert make("install", f"PYTHON={other}") == installs("-e . -c requirements.lock")
    assert python.read_text() == other.read_text()
    assert make("install", f"PYTHON={other}") == []
    # An interpreter that does not run is refused before anything is removed.
    result = subprocess.run(
        ["make", "install", "PYTHON=python2.9"], cwd=tmp_path, capture_output=True, text=True
    )
    assert (
        result.returncode != 0
        and "PYTHON=python2.9 does not run; give an installed interpreter" in result.stdout
    )
    assert python.exists()


def test_make_clean_removes_logs_and_caches_but_never_data(tmp_path: Path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    files = ["logs/train/runs/x/run.json", "data/mnist5k/mnist_5k.npz", "data/.gitkeep", "logs/.gitkeep"]
    files += [".pytest_cache/v/x", ".ruff_cache/x", "src/__pycache__/a.pyc", ".venv/lib/__pycache__/b.pyc"]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, check=True)
    left = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert left == {
        "Makefile",
        "data/mnist5k/mnist_5k.npz",
        "data/.gitkeep",
        "logs/.gitkeep",
        ".venv/lib/__pycache__/b.pyc",
    }


def test_the_ci_workflow_lints_then_tests_every_supported_python_and_checks_the_newest_lightning_weekly():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert {"push", "pull_request", "schedule"} <= set(triggers)
    assert triggers["schedule"][0]["cron"].split()[-1] == "1"  # weekly, on Mondays
    jobs = workflow["jobs"]
    assert set(jobs) == {"lint", "test", "newest-lightning"}
    assert any("pre-commit run --all-files" in step.get("run", "") for step in jobs["lint"]["steps"])
    test = jobs["test"]
    assert test["needs"] == "lint"
    # From the oldest Python the project supports (3.11 at least: requirements.lock needs it) to 3.13.
    oldest = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    matrix = test["strategy"]["matrix"]["python"]
    assert f">={matrix[0]}" == oldest and matrix[0] >= "3.11" and matrix[-1] == "3.13"
    runs = " ".join(step.get("run", "") for step in test["steps"])
    assert "make test" in runs and "TORCH_INDEX" in runs
    assert workflow["env"]["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    assert any(step.get("with", {}).get("cache") == "pip" for step in test["steps"])
    newest = " ".join(step.get("run", "") for step in jobs["newest-lightning"]["steps"])
    assert "--upgrade" in newest and "lightning" in newest and "pytest" in newest
    assert "schedule" in jobs["newest-lightning"]["if"]


def test_shell_completion_installs_for_bash():
    result = subprocess.run(
        [sys.executable, "src/train.py", "-sc", "install=bash"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "complete -o nospace -o default -F hydra_bash_completion" in result.stdout


def installed_commands(project: Path) -> dict[str, str]:
    """The commands `pip install` puts on PATH: [project.scripts] of pyproject.toml."""
    return tomllib.loads((project / "pyproject.toml").read_text())["project"]["scripts"]


def assert_commands_are_the_projects_own(project: Path) -> None:
    """Each command is <project name>-<task>, and with the venv off PATH bash knows no such name: it is no
    builtin or keyword (`export run_dir=...` would silently set a variable) and no system command."""
    name = tomllib.loads((project / "pyproject.toml").read_text())["project"]["name"]
    commands = installed_commands(project)
    entry_points = [path for path in (project / "src").glob("*.py") if "@hydra.main(" in path.read_text()]
    assert sorted(commands) == sorted(f"{name}-{path.stem}" for path in entry_points)  # one per entry point
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != BIN)
    for command in commands:
        kind = subprocess.run(
            ["bash", "-c", f"type -t {command}"], env={"PATH": path}, capture_output=True, text=True
        )
        assert kind.stdout.strip() == "", f"{command} is a bash {kind.stdout.strip()}"


def test_installed_commands_are_named_after_the_project_and_clash_with_nothing():
    assert_commands_are_the_projects_own(ROOT)
    missing = [command for command in installed_commands(ROOT) if not (BIN / command).exists()]
    assert not missing, f"not installed in {BIN}: {missing}; run make install"
    # The check itself can fail: bash does know the bare task names that used to be commands.
    for builtin in ("eval", "export"):
        kind = subprocess.run(["bash", "-c", f"type -t {builtin}"], capture_output=True, text=True)
        assert kind.stdout.strip() == "builtin"
