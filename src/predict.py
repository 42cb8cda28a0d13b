"""Predict with a checkpoint: `python src/predict.py run_dir=<run> inputs=<images>` (see configs/predict.yaml)."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

import src  # noqa: F401 - registers the config resolvers

# An absolute path: the same configs whether started as `python src/predict.py` or as the `predict` command.
CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="predict")
def main(cfg: DictConfig) -> None:
    # Imported here, so that `--help` and `--cfg job` answer without loading torch and Lightning.
    from src.inference.tasks import predict

    predict(cfg)


if __name__ == "__main__":
    main()
