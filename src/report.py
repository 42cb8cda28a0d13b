"""Compare runs: `python src/report.py 'runs=[logs/train/multiruns/*,logs/train/runs/<run>]'` (see
configs/report.yaml)."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

import src  # noqa: F401 - registers the config resolvers

# An absolute path: the same configs whether started as `python src/report.py` or as the `report` command.
CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="report")
def main(cfg: DictConfig) -> None:
    # Imported here, so that `--help` and `--cfg job` answer at once. The report reads files only: it imports
    # neither torch nor Lightning, so its code is src/run_comparison.py, not with the tasks in src/tasks.py.
    from src.run_comparison import report

    report(cfg)


if __name__ == "__main__":
    main()
