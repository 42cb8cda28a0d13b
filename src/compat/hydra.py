"""Hydra's run of a task function, from Python: the one use of Hydra beyond its public API in this template
(src/api.py runs the tasks through it).

- `GlobalHydra.instance().hydra.run(...)`: the method `@hydra.main` itself calls for a single run. Its object
  is a `Hydra` (defined in `hydra._internal.hydra`); no public function runs a task as `@hydra.main` does.
  Hydra's compose API gives the config only: no run directory, no `.hydra/` snapshot, no log file, no
  `HydraConfig` (by design, Hydra issues #1810 and #2456), so a task run on a composed config would write its
  run elsewhere than the command line does. Upstream: Hydra issue #2794 (merge the compose API and
  `@hydra.main`, open). When it breaks: src/api.py's tests fail on the call below; read `hydra.main`'s path
  to `run_job` in the new release.
"""

from collections.abc import Callable
from typing import Any

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def run_task(
    config_dir: str, config_name: str, task: Callable[[DictConfig], Any], overrides: list[str]
) -> Any:
    """`task` run on `config_name` with `overrides` as `python src/<config_name>.py overrides` runs it (run
    dir, snapshot, log file, HydraConfig); what it returned, or the error it raised. Afterwards no Hydra run
    is left set up, so the next call (or a later compose) starts from scratch."""
    try:
        with initialize_config_dir(config_dir, version_base="1.3", job_name=config_name):
            job = GlobalHydra.instance().hydra.run(
                config_name=config_name, task_function=task, overrides=overrides
            )
        return job.return_value
    finally:
        HydraConfig.instance().cfg = None
