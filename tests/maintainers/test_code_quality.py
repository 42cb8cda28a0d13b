"""The template's own code passes the linter it ships with (ruff, configured in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent))  # the venv's ruff, from the dev extra


CODE = ["src", "tests", "scripts", "hydra_plugins"]  # what `make lint` checks


@pytest.mark.skipif(RUFF is None, reason="ruff not installed")
@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff_is_clean(command: list[str]):
    result = subprocess.run([RUFF, *command, *CODE], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
