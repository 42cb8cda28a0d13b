"""Write a data option's splits as litdata shards for data=streaming:
`python src/shard.py data=<option> output_dir=<dir>` (see configs/shard.yaml)."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

import src  # noqa: F401 - registers the config resolvers

# An absolute path: the same configs whether started as `python src/shard.py` or as the `shard` command.
CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="shard")
def main(cfg: DictConfig) -> None:
    # Imported here, so that `--help` and `--cfg job` answer without loading torch and Lightning.
    from src.sharding import shard

    shard(cfg)


if __name__ == "__main__":
    main()
