"""Shared fixtures: compose the real configs, and run the real command line, writing into tmp_path."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import src  # noqa: F401 - registers the config resolvers

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"

# wandb must never ask for a login or reach the network in tests.
os.environ["WANDB_MODE"] = "offline"
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses its local file store without it


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir for the whole session, so the mnist5k cache is parsed once."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture
def compose_cfg(tmp_path: Path, data_dir: Path):
    """Compose `train` or `eval` with overrides, as `python src/<name>.py` would, writing into tmp_path."""

    def _compose(config_name: str = "train", overrides: list[str] = ()) -> DictConfig:
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=list(overrides), return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path)
            cfg.paths.log_dir = str(tmp_path / "logs")
            cfg.paths.data_dir = str(data_dir)
            del cfg.hydra
        return cfg

    yield _compose
    GlobalHydra.instance().clear()


def run_cli(
    script: str, *overrides: str, log_dir: Path, data_dir: Path, cwd: Path = ROOT, timeout: int = 300
):
    """Run `python src/<script>.py overrides...` as a user would; return the completed process."""
    command = [sys.executable, str(ROOT / "src" / f"{script}.py"), *overrides]
    command += [f"paths.log_dir={log_dir}", f"paths.data_dir={data_dir}", "extras.print_config=false"]
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def last_metrics(run_dir: Path) -> dict[str, float]:
    """The last value of every metric in a run's CSV log."""
    values: dict[str, float] = {}
    with open(run_dir / "csv" / "version_0" / "metrics.csv") as file:
        for row in csv.DictReader(file):
            values |= {k: float(v) for k, v in row.items() if v not in ("", None)}
    return values


def only_run_dir(log_dir: Path, task: str = "train") -> Path:
    runs = list((log_dir / task / "runs").iterdir())
    assert len(runs) == 1, f"expected one run dir, found {runs}"
    return runs[0]
