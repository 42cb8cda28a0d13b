"""The template's own code passes the linter it ships with (ruff, configured in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent))  # the venv's ruff, from the dev extra


@pytest.mark.skipif(RUFF is None, reason="ruff not installed")
def test_ruff_is_clean():
    result = subprocess.run([RUFF, "check", "src", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
