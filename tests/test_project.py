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
    listed = subprocess.check_output(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT
    )
    return [name for name in listed.decode().splitlines() if (ROOT / name).is_file()]


# The hooks that only check, each run here with its arguments in .pre-commit-config.yaml on the files it checks
# (None: every file), and what makes it check all of them, not only those being committed.
CHECKING = {"check-yaml": (".yaml", ".yml"), "check-toml": (".toml",), "check-merge-conflict": None,
            "check-added-large-files": None, "codespell": None, "nbstripout": (".ipynb",)}  # fmt: skip
CHECK_ALL = {"check-added-large-files": ["--enforce-all"], "nbstripout": ["--verify"]}


def hooks() -> dict[str, dict]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    return {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}


def test_every_pre_commit_hook_is_one_these_tests_run():
    assert set(hooks()) == set(CHECKING) | {"trailing-whitespace", "end-of-file-fixer", "ruff", "ruff-format"}


def test_no_trailing_whitespace_and_one_final_newline():
    """What the trailing-whitespace and end-of-file-fixer hooks would fix, checked without changing files."""
    bad = []
    for name in tracked_files():
        data = (ROOT / name).read_bytes()
        if b"\0" in data or not data:
            continue  # binary or empty
        bad += [
            f"{name}:{i + 1}: trailing whitespace"
            for i, line in enumerate(data.split(b"\n"))
            if line != line.rstrip()
        ]
        if not data.endswith(b"\n") or data.endswith(b"\n\n"):
            bad.append(f"{name}: must end with exactly one newline")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("hook", CHECKING)
def test_the_checking_hooks_pass_on_every_file(hook: str):
    assert (BIN / hook).exists()  # also nbstripout, for the notebooks a project adds
    files = [name for name in tracked_files() if CHECKING[hook] is None or name.endswith(CHECKING[hook])]
    if files:
        command = [BIN / hook, *hooks()[hook].get("args", []), *CHECK_ALL.get(hook, []), *files]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_make_help_lists_every_target_with_one_line():
    lines = subprocess.check_output(["make", "help"], cwd=ROOT, text=True).splitlines()
    for target in re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M):
        line = next((line for line in lines if line.split()[:1] == [target]), None)
        assert line is not None and len(line.split()) > 2, f"make help has no line for {target}"


def stand_in(path: Path, version_check: str, calls: Path, also: str = "") -> Path:
    """An executable `python` that answers the version check with `version_check` and logs its other calls."""
    path.write_text(
        f'#!/bin/sh\ncase "$2" in *version_info*) {version_check};; esac\n{also}echo "$@" >> {calls}\n'
    )
    path.chmod(0o755)
    return path


def test_make_installs_again_when_python_or_the_lock_change_and_only_then(tmp_path: Path):
    """`make install LOCK=` or `PYTHON=` after an install re-installs, not skipped by a fresh stamp; `make
    test`'s install (the extras) counts as the lean one too. A stand-in .venv/bin/python logs the calls."""
    for name in ("Makefile", "pyproject.toml", "requirements.lock"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.log"
    python = stand_in(tmp_path / ".venv" / "bin" / "python", f'exec {sys.executable} "$@"', calls)

    def make(*args: str) -> list[str]:
        calls.write_text("")
        result = subprocess.run(["make", *args], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        return calls.read_text().splitlines()

    # An install brings pip to the Makefile's version, then installs without compiling (Python writes the
    # bytecode of what a run imports, when it first imports it).
    pip = re.search(r"^PIP_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), flags=re.M)[1]
    locked = [f"-m pip install --quiet pip=={pip}", "-m pip install --no-compile -e . -c requirements.lock"]
    assert make("install") == locked and make("install") == []
    assert make("install", "LOCK=") == [locked[0], "-m pip install --no-compile -e ."]
    assert make("install", "LOCK=") == [] and make("install") == locked
    extras = ",".join(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    every_extra = f"-m pip install --no-compile -e .[{extras}] -c requirements.lock"
    assert make("install-test") == [locked[0], every_extra]
    assert make("install") == []  # the test install holds the lean one
    # Another Python makes .venv anew with it (a stand-in "Python 3.99" that makes stand-in venvs of itself).
    other = tmp_path / "python3.99"
    venv = f'if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin" && cp {other} "$3/bin/python"; exit; fi\n'
    stand_in(other, 'echo "(3, 99)"; exit', calls, also=venv)
    assert make("install", f"PYTHON={other}") == locked and python.read_text() == other.read_text()
    assert make("install", f"PYTHON={other}") == []
    # An interpreter that does not run is refused before anything is removed.
    refused = subprocess.run(
        ["make", "install", "PYTHON=python2.9"], cwd=tmp_path, capture_output=True, text=True
    )
    assert refused.returncode != 0 and python.exists()
    assert "PYTHON=python2.9 does not run; give an installed interpreter" in refused.stdout


def test_make_clean_removes_logs_and_caches_but_never_data(tmp_path: Path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    kept = {
        "Makefile",
        "data/mnist5k/mnist_5k.npz",
        "data/.gitkeep",
        "logs/.gitkeep",
        ".venv/lib/__pycache__/b.pyc",
    }
    removed = {"logs/train/runs/x/run.json", ".pytest_cache/v/x", ".ruff_cache/x", "src/__pycache__/a.pyc"}
    for name in (kept | removed) - {"Makefile"}:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, check=True)
    assert {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()} == kept


def test_the_ci_workflow_lints_then_tests_every_supported_python_and_checks_the_newest_lightning_weekly():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    triggers, jobs = workflow.get("on", workflow.get(True)), workflow["jobs"]  # YAML 1.1 reads `on` as true
    assert {"push", "pull_request", "schedule"} <= set(triggers) and set(jobs) == {
        "lint",
        "test",
        "newest-lightning",
    }
    assert triggers["schedule"][0]["cron"].split()[-1] == "1"  # weekly, on Mondays
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


def bash_kind(name: str, path: str | None = None) -> str:
    """What bash takes `name` for (builtin, keyword, file, ...; "" for nothing), with PATH `path` if given."""
    env = {"PATH": path} if path is not None else None
    return subprocess.run(
        ["bash", "-c", f"type -t {name}"], env=env, capture_output=True, text=True
    ).stdout.strip()


def assert_commands_are_the_projects_own(project: Path) -> None:
    """Each command is <project name>-<task>, and with the venv off PATH bash knows no such name: it is no
    builtin or keyword (`export run_dir=...` would silently set a variable) and no system command."""
    name = tomllib.loads((project / "pyproject.toml").read_text())["project"]["name"]
    entry_points = [path for path in (project / "src").glob("*.py") if "@hydra.main(" in path.read_text()]
    commands = installed_commands(project)
    assert sorted(commands) == sorted(f"{name}-{path.stem}" for path in entry_points)  # one per entry point
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != BIN)
    for command in commands:
        assert bash_kind(command, path) == "", f"{command} is a bash {bash_kind(command, path)}"


def test_installed_commands_are_named_after_the_project_and_clash_with_nothing():
    assert_commands_are_the_projects_own(ROOT)
    missing = [command for command in installed_commands(ROOT) if not (BIN / command).exists()]
    assert not missing, f"not installed in {BIN}: {missing}; run make install"
    # The check itself can fail: bash does know the bare task names that used to be commands.
    assert bash_kind("eval") == bash_kind("export") == "builtin"
