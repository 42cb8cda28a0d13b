"""Evaluate a checkpoint: `python src/eval.py ckpt_path=<file.ckpt> [overrides]` (see configs/eval.yaml)."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

import src  # noqa: F401 - registers the config resolvers

# An absolute path: the same configs whether started as `python src/eval.py` or as the `eval` command.
CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="eval")
def main(cfg: DictConfig) -> None:
    # Imported here, so that `--help` and `--cfg job` answer without loading torch and Lightning.
    from src.launch import hydra_ddp
    from src.tasks import evaluate

    hydra_ddp.install(script=__file__)  # Lightning's DDP workers re-run this file, on this job only
    evaluate(cfg)


if __name__ == "__main__":
    main()
