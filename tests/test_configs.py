"""Every option of every config group composes and instantiates."""

from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from src.builder import instantiate_group

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def test_train_config_has_the_documented_keys(compose_cfg):
    cfg = compose_cfg("train")
    for key in ("task_name", "tags", "train", "test", "ckpt_path", "seed", "optimized_metric"):
        assert key in cfg
    assert cfg.data._target_.endswith("MNIST5kDataModule") and cfg.model.net._target_.endswith("SimpleCNN")
    OmegaConf.resolve(cfg)  # every interpolation resolves


def test_eval_config_requires_ckpt_path(compose_cfg):
    cfg = compose_cfg("eval")
    assert OmegaConf.is_missing(cfg, "ckpt_path")


@pytest.mark.parametrize("option", options("data"))
def test_data_options_instantiate(compose_cfg, option):
    datamodule = instantiate(compose_cfg("train", [f"data={option}"]).data, _convert_="all")
    assert isinstance(datamodule, L.LightningDataModule)


@pytest.mark.parametrize("option", options("model"))
def test_model_options_instantiate_and_fit_the_data(compose_cfg, option):
    for data, shape in (("mnist5k", (2, 1, 28, 28)), ("digits", (2, 1, 8, 8))):
        model = instantiate(compose_cfg("train", [f"model={option}", f"data={data}"]).model)
        model.eval()
        assert model(torch.zeros(shape)).shape == (2, 10)


@pytest.mark.parametrize("part", ["optimizer", "scheduler"])
def test_optimizer_and_scheduler_options_compose(compose_cfg, part):
    for option in options(f"model/{part}"):
        cfg = compose_cfg("train", [f"model/{part}={option}"])
        assert cfg.model[part]._partial_ is True
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        if part == "optimizer":
            assert isinstance(
                instantiate(cfg.model.optimizer)(params=optimizer.param_groups[0]["params"]),
                torch.optim.Optimizer,
            )
        else:
            assert hasattr(instantiate(cfg.model.scheduler)(optimizer=optimizer), "step")


@pytest.mark.parametrize("option", options("callbacks"))
def test_callback_options_instantiate(compose_cfg, option):
    callbacks = instantiate_group(compose_cfg("train", [f"callbacks={option}"]).callbacks, "callbacks")
    assert all(isinstance(c, L.Callback) for c in callbacks)
    assert len(callbacks) == {"default": 5, "none": 0}.get(option, 1)


@pytest.mark.parametrize("option", options("logger"))
def test_logger_options_instantiate(compose_cfg, option):
    loggers = instantiate_group(compose_cfg("train", [f"logger={option}"]).logger, "logger")
    assert len(loggers) == (3 if option == "many_loggers" else 1)


NEEDS = {
    "gpu": torch.cuda.is_available(),
    "ddp": torch.cuda.is_available(),
    "mps": torch.backends.mps.is_available(),
}


@pytest.mark.parametrize("option", options("trainer"))
def test_trainer_options_instantiate(compose_cfg, option):
    if not NEEDS.get(option, True):
        pytest.skip(f"trainer={option} needs a {'cuda' if option != 'mps' else 'mps'} device, none here")
    trainer = instantiate(compose_cfg("train", [f"trainer={option}"]).trainer, logger=False)
    assert isinstance(trainer, L.Trainer)


def test_ddp_preset_on_cpu_is_two_processes(compose_cfg):
    cfg = compose_cfg("train", ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"])
    trainer = instantiate(cfg.trainer, logger=False)
    assert trainer.world_size == 2 and type(trainer.strategy).__name__ == "DDPStrategy"


@pytest.mark.parametrize("preset", options("debug"))
def test_debug_presets_compose(compose_cfg, preset):
    cfg = compose_cfg("train", [f"debug={preset}"])
    assert cfg.task_name == "debug" and cfg.trainer.accelerator == "cpu"


@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiments_compose(compose_cfg, experiment):
    cfg = compose_cfg("train", [f"experiment={experiment}"])
    OmegaConf.resolve(cfg)
    assert cfg.tags


def test_a_group_entry_without_target_is_refused():
    with pytest.raises(ValueError, match=r"callbacks.oops has no _target_"):
        instantiate_group(OmegaConf.create({"oops": {"monitor": "val/acc"}}), "callbacks")


def test_empty_tags_are_refused_when_enforced(compose_cfg):
    from src.utils.config import apply_extras

    with pytest.raises(ValueError, match=r"tags is empty; label the run, e.g. tags=\[baseline\]"):
        apply_extras(compose_cfg("train", ["tags=[]"]))
