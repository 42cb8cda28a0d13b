"""Evaluate a checkpoint: `python src/eval.py ckpt_path=<file.ckpt> [overrides]` (see configs/eval.yaml)."""

import hydra
from omegaconf import DictConfig

import src  # noqa: F401 - registers the config resolvers


@hydra.main(version_base="1.3", config_path="../configs", config_name="eval")
def main(cfg: DictConfig) -> None:
    # Imported here, so that `--help` and `--cfg job` answer without loading torch and Lightning.
    from src.tasks import evaluate

    evaluate(cfg)


if __name__ == "__main__":
    main()
