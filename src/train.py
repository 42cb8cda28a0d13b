"""Train a model: `python src/train.py [overrides]` (see configs/train.yaml and docs/tutorial.md)."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

import src  # noqa: F401 - registers the config resolvers

# An absolute path: the same configs whether started as `python src/train.py` or as the `train` command.
CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def main(cfg: DictConfig) -> float | None:
    # Imported here, so that `--help` and `--cfg job` answer without loading torch and Lightning.
    from src.launch import hydra_ddp
    from src.tasks import optimized_metric, train

    hydra_ddp.install(script=__file__)  # Lightning's DDP workers re-run this file, on this job only
    return optimized_metric(cfg, train(cfg))


if __name__ == "__main__":
    main()
