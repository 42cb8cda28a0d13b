"""Train a model: `python src/train.py [overrides]` (see configs/train.yaml and the README)."""

import hydra
from omegaconf import DictConfig

import src  # noqa: F401 - registers the config resolvers


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # Imported here, so that `--help` and `--cfg job` answer without loading torch and Lightning.
    from src.tasks import optimized_metric, train

    return optimized_metric(cfg, train(cfg))


if __name__ == "__main__":
    main()
