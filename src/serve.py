"""Serve a checkpoint over HTTP: `python src/serve.py run_dir=<run>` (see configs/serve.yaml, docs/serve.md)."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

import src  # noqa: F401 - registers the config resolvers

# An absolute path: the same configs whether started as `python src/serve.py` or as the `serve` command.
CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="serve")
def main(cfg: DictConfig) -> None:
    # Imported here, so that `--help` and `--cfg job` answer without loading torch, Lightning and LitServe.
    from src.inference.serving import serve

    serve(cfg)


if __name__ == "__main__":
    main()
