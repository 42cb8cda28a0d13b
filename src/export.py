"""Export a checkpoint: `python src/export.py run_dir=<run> format=onnx` (see configs/export.yaml)."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

import src  # noqa: F401 - registers the config resolvers

# An absolute path: the same configs whether started as `python src/export.py` or as the `export` command.
CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="export")
def main(cfg: DictConfig) -> None:
    # Imported here, so that `--help` and `--cfg job` answer without loading torch and Lightning.
    from src.inference.tasks import export

    export(cfg)


if __name__ == "__main__":
    main()
