"""Every option of every config group composes and instantiates."""

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml
from hydra.utils import instantiate
from omegaconf import OmegaConf

from src.run.builder import instantiate_group
from src.run.trained_run import chosen_groups, with_keys_set
from tests.test_data import BUILD_WITH

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def test_train_config_has_the_documented_keys(compose_cfg):
    cfg = compose_cfg("train")
    for key in ("task_name", "tags", "train", "test", "ckpt_path", "seed", "optimized_metric"):
        assert key in cfg
    assert cfg.data._target_.endswith("MNIST5kDataModule") and cfg.model.net._target_.endswith("SimpleCNN")
    OmegaConf.resolve(cfg)  # every interpolation resolves


def test_eval_composes_the_data_and_model_of_the_same_overrides_as_train(compose_cfg):
    """So that a checkpoint outside a run dir evaluates with its training run's overrides."""
    for overrides in ([], ["data=digits", "model/net=mlp"], ["experiment=digits_mlp"]):
        evaluated, trained = compose_cfg("eval", overrides), compose_cfg("train", overrides)
        assert evaluated.data == trained.data and evaluated.model == trained.model
    cfg = compose_cfg("eval")
    assert cfg.ckpt_path is None and cfg.run_dir is None  # one of them is given (src/eval.py says so)


@pytest.mark.parametrize(
    ("overrides", "run_config_kept_for"),
    [
        ([], {"data", "model"}),
        (["data.batch_size=256", "+model.extra=1", "trainer.max_epochs=1"], {"data", "model"}),
        (["data=digits"], {"model"}),
        (["model/net=mlp"], {"data"}),
        (["experiment=digits_mlp"], set()),
    ],
)
def test_eval_keeps_the_runs_data_and_model_unless_the_command_line_chooses_them(
    overrides, run_config_kept_for
):
    assert {"data", "model"} - chosen_groups(overrides) == run_config_kept_for


def test_single_keys_on_the_command_line_go_on_top_of_the_runs_config():
    run = {"_target_": "src.data.digits_datamodule.DigitsDataModule", "batch_size": 64, "augment": True}
    overrides = ["data.batch_size=256", "+data.loader.workers=0", "~data.augment", "model.compile=true"]
    assert with_keys_set(run, overrides, "data") == {
        "_target_": "src.data.digits_datamodule.DigitsDataModule",
        "batch_size": 256,
        "loader": {"workers": 0},
    }
    assert with_keys_set({"compile": False}, overrides, "model") == {"compile": True}


@pytest.mark.parametrize("option", options("data"))
def test_data_options_instantiate(compose_cfg, option):
    datamodule = instantiate(
        compose_cfg("train", [f"data={option}", *BUILD_WITH.get(option, [])]).data, _convert_="all"
    )
    assert isinstance(datamodule, L.LightningDataModule)


# The data options each model option is checked with: (data, input batch shape, output shape).
MODEL_CHECKS = {
    "classifier": [("mnist5k", (2, 1, 28, 28), (2, 10)), ("digits", (2, 1, 8, 8), (2, 10))],
    "segmenter": [("digit_scenes", (2, 1, 64, 64), (2, 11, 64, 64))],  # [part: segmentation]
    "text_classifier": [("example_texts", (2, 12), (2, 3))],  # (texts, tokens)  [part: text]
}
# What a model option needs besides its data, and its input batch of the checked shape (default: zeros).
MODEL_CHECKS_WITH: dict[str, list[str]] = {}
BATCH_OF: dict[str, Callable[[tuple[int, ...]], Any]] = {}
# part: text
# The example texts' tokenizer, which building the data writes; a batch of token ids.
MODEL_CHECKS_WITH["text_classifier"] = ["model.net.tokenizer=${paths.data_dir}/example_texts/tokenizer"]
BATCH_OF["text_classifier"] = lambda shape: {"input_ids": torch.ones(shape, dtype=torch.long)}
# /part


@pytest.mark.parametrize("option", options("model"))
def test_model_options_instantiate_and_fit_the_data(compose_cfg, option):
    assert option in MODEL_CHECKS, f"model={option}: add the data it is checked with to MODEL_CHECKS"
    for data, shape, output in MODEL_CHECKS[option]:
        cfg = compose_cfg("train", [f"model={option}", f"data={data}", *MODEL_CHECKS_WITH.get(option, [])])
        instantiate(cfg.data, _convert_="all")
        model = instantiate(cfg.model)
        model.eval()
        batch = BATCH_OF.get(option, torch.zeros)(shape)
        assert model(batch).shape == output


def test_channels_last_converts_the_convs_and_gives_the_same_outputs(compose_cfg):
    cfg = compose_cfg("train", ["model=classifier", "data=mnist5k"])
    plain = instantiate(cfg.model)
    fast = instantiate(
        compose_cfg("train", ["model=classifier", "data=mnist5k", "model.channels_last=true"]).model
    )
    fast.load_state_dict(plain.state_dict())
    fast.configure_model()  # what the Trainer calls once the strategy is set up
    conv = next(m for m in fast.net.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    images = torch.randn(4, 1, 28, 28)
    plain.eval(), fast.eval()
    with torch.no_grad():
        torch.testing.assert_close(fast(images), plain(images))


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
            # total_steps: null is the run's length, which the module fills in from the trainer.
            run_length = {"total_steps": 10} if cfg.model.scheduler.get("total_steps", 0) is None else {}
            assert hasattr(instantiate(cfg.model.scheduler)(optimizer=optimizer, **run_length), "step")


@pytest.mark.parametrize("option", options("callbacks"))
def test_callback_options_instantiate(compose_cfg, option):
    callbacks = instantiate_group(compose_cfg("train", [f"callbacks={option}"]).callbacks, "callbacks")
    assert all(isinstance(c, L.Callback) for c in callbacks)
    listed = yaml.safe_load((CONFIG_DIR / "callbacks" / "default.yaml").read_text())["defaults"]
    assert len(callbacks) == {"default": len(listed) - 1, "none": 0}.get(option, 1)  # - _self_


@pytest.mark.parametrize("option", options("logger"))
def test_logger_options_instantiate(compose_cfg, option):
    offline = ["logger.wandb.offline=true"] if option == "wandb" else []  # many_loggers sets it itself
    cfg = compose_cfg("train", [f"logger={option}", *offline])
    loggers = instantiate_group(cfg.logger, "logger")
    assert len(loggers) == len(cfg.logger) >= 1  # one per entry (many_loggers: csv, tensorboard, wandb)
    assert all(isinstance(logger, L.pytorch.loggers.Logger) for logger in loggers)


HAS_CUDA = torch.cuda.is_available()
# Presets that run on CUDA GPUs only; on a CPU machine their CPU variant or the clear refusal is tested below.
CUDA_PRESETS = {"gpu", "ddp", "ddp_spawn", "fsdp", "deepspeed"}


@pytest.mark.parametrize("option", options("trainer"))
def test_trainer_options_instantiate(compose_cfg, option):
    if option == "mps" and not torch.backends.mps.is_available():
        pytest.skip("trainer=mps needs an Apple silicon GPU, none here")
    if option in CUDA_PRESETS and not HAS_CUDA:
        pytest.skip(f"trainer={option} needs CUDA GPUs, none here (its CPU checks are the tests below)")
    if option == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("trainer=deepspeed needs the deepspeed extra, not installed")
    trainer = instantiate(compose_cfg("train", [f"trainer={option}"]).trainer, logger=False)
    assert isinstance(trainer, L.Trainer)


@pytest.mark.parametrize(("preset", "strategy"), [("ddp", "DDPStrategy"), ("ddp_spawn", "SpawnDDPStrategy")])
def test_ddp_presets_on_cpu_are_two_processes(compose_cfg, preset, strategy):
    cfg = compose_cfg("train", [f"trainer={preset}", "trainer.accelerator=cpu", "trainer.devices=2"])
    trainer = instantiate(cfg.trainer, logger=False)
    assert trainer.world_size == 2 and type(trainer.strategy).__name__ == strategy


def test_fsdp_preset_builds_its_strategy_with_the_configured_policy(compose_cfg):
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import ShardingStrategy

    cfg = compose_cfg("train", ["trainer=fsdp", "trainer.strategy.sharding_strategy=SHARD_GRAD_OP"])
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    wrap = strategy.kwargs["auto_wrap_policy"]  # wraps subtrees of at least min_num_params parameters
    assert wrap(torch.nn.Linear(1000, 1000), recurse=False, nonwrapped_numel=1_001_000)
    assert not wrap(torch.nn.Linear(10, 10), recurse=False, nonwrapped_numel=110)


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="the deepspeed extra is not installed"
)
def test_deepspeed_preset_builds_zero_stage_2_and_the_stage_is_a_key(compose_cfg):
    from lightning.pytorch.strategies import DeepSpeedStrategy

    strategy = instantiate(compose_cfg("train", ["trainer=deepspeed"]).trainer.strategy)
    assert isinstance(strategy, DeepSpeedStrategy) and strategy.config["zero_optimization"]["stage"] == 2
    strategy = instantiate(
        compose_cfg("train", ["trainer=deepspeed", "trainer.strategy.stage=3"]).trainer.strategy
    )
    assert strategy.config["zero_optimization"]["stage"] == 3


def test_lightning_itself_refuses_fsdp_on_the_cpu(compose_cfg):
    """Why the preflight check exists for trainer=fsdp: Lightning 2.6 refuses FSDP without a GPU."""
    cfg = compose_cfg("train", ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2"])
    with pytest.raises(Exception, match=r"The strategy `fsdp` requires a GPU accelerator"):
        instantiate(cfg.trainer, logger=False)


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
    from src.run.extras import apply_extras

    with pytest.raises(ValueError, match=r"tags is empty; label the run, e.g. tags=\[baseline\]"):
        apply_extras(compose_cfg("train", ["tags=[]"]))


# part: optuna
@pytest.mark.parametrize("search", options("hparams_search"))
def test_every_value_of_each_hparams_search_composes_into_a_model(search, data_dir: Path):
    from hydra import compose, initialize_config_dir
    from optuna.distributions import CategoricalDistribution

    from hydra_plugins.optuna_sweeper.optuna_sweeper import OptunaSweeper, parse_search

    def compose_train(overrides: list[str]):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return compose("train", overrides=overrides, return_hydra_config=True)

    cfg = compose_train([f"hparams_search={search}", f"paths.data_dir={data_dir}"])
    assert cfg.hydra.sweeper._target_ == f"{OptunaSweeper.__module__}.OptunaSweeper"
    assert cfg.hydra.sweeper.study_name == search
    assert cfg.callbacks.optuna_pruning.monitor == cfg.optimized_metric
    space, _ = parse_search(cfg.hydra.sweeper.params, [])
    assert space.distributions
    for key, dist in space.distributions.items():  # each choice, and both ends of each interval
        values = dist.choices if isinstance(dist, CategoricalDistribution) else (dist.low, dist.high)
        for value in values:
            trial_cfg = compose_train(
                [f"hparams_search={search}", f"paths.data_dir={data_dir}", space.override(key, value)]
            )
            instantiate(trial_cfg.data, _convert_="all")  # writes what the model may read (the example texts)
            assert isinstance(instantiate(trial_cfg.model), L.LightningModule)


# /part
