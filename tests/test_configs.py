"""Every option of every config group composes and instantiates; eval composes what train composed."""

import importlib.util
from collections.abc import Callable
from typing import Any

import lightning as L  # [part: optuna]
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from src import api  # [part: optuna]
from src.run.builder import complete_config, instantiate_group
from src.run.extras import apply_extras
from src.run.trained_run import chosen_groups, with_keys_set
from tests.conftest import CONFIG_DIR


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def test_train_has_the_documented_keys_and_eval_builds_the_data_and_model_train_built(compose_cfg):
    """So that a checkpoint outside a run dir evaluates with its training run's overrides."""
    cfg = compose_cfg("train")
    assert {"task_name", "tags", "train", "test", "ckpt_path", "seed", "optimized_metric"} <= set(cfg)
    assert cfg.data._target_.endswith("MNIST5kDataModule") and cfg.model.net._target_.endswith("SimpleCNN")
    OmegaConf.resolve(cfg)  # every interpolation resolves
    evaluated = compose_cfg("eval")
    assert evaluated.ckpt_path is None and evaluated.run_dir is None  # one of them is given (src/eval.py)
    for overrides in ([], ["data=digits", "model/net=mlp"], ["experiment=digits_mlp"]):
        evaluated, trained = compose_cfg("eval", overrides), compose_cfg("train", overrides)
        assert evaluated.data == trained.data and evaluated.model == trained.model


def test_eval_keeps_the_runs_data_and_model_unless_chosen_and_puts_single_keys_on_top():
    def kept(*overrides: str) -> set[str]:
        return {"data", "model"} - chosen_groups(list(overrides))

    assert (
        kept() == kept("data.batch_size=256", "+model.extra=1", "trainer.max_epochs=1") == {"data", "model"}
    )
    assert (kept("data=digits"), kept("model/net=mlp"), kept("experiment=digits_mlp")) == (
        {"model"},
        {"data"},
        set(),
    )
    run = {"_target_": "src.data.digits_datamodule.DigitsDataModule", "batch_size": 64, "augment": True}
    overrides = ["data.batch_size=256", "+data.loader.workers=0", "~data.augment", "model.compile=true"]
    expected = {"_target_": run["_target_"], "batch_size": 256, "loader": {"workers": 0}}
    assert with_keys_set(run, overrides, "data") == expected
    assert with_keys_set({"compile": False}, overrides, "model") == {"compile": True}


MODEL_CHECKS = {
    # The data options each model option is checked with: (data, input batch shape, output shape).
    "classifier": [("mnist5k", (2, 1, 28, 28), (2, 10)), ("digits", (2, 1, 8, 8), (2, 10))],
    "segmenter": [("digit_scenes", (2, 1, 64, 64), (2, 11, 64, 64))],  # [part: segmentation]
    "text_classifier": [("example_texts", (2, 12), (2, 3))],  # (texts, tokens)  [part: text]
}
# A model option's input batch of the checked shape (default: zeros).
BATCH_OF: dict[str, Callable[[tuple[int, ...]], Any]] = {}
BATCH_OF["text_classifier"] = lambda shape: {"input_ids": torch.ones(shape, dtype=torch.long)}  # [part: text]


@pytest.mark.parametrize("option", options("model"))
def test_model_options_instantiate_and_fit_the_data(compose_cfg, option):
    assert option in MODEL_CHECKS, f"model={option}: add the data it is checked with to MODEL_CHECKS"
    for data, shape, output in MODEL_CHECKS[option]:
        cfg = compose_cfg("train", [f"model={option}", f"data={data}"])
        complete_config(cfg)  # as a run does: the example texts hand their tokenizer to the net
        instantiate(cfg.data, _convert_="all")
        model = instantiate(cfg.model).eval()
        assert model(BATCH_OF.get(option, torch.zeros)(shape)).shape == output


def test_channels_last_converts_the_convs_and_gives_the_same_outputs(compose_cfg):
    plain, fast = (
        instantiate(compose_cfg("train", ["data=mnist5k", *extra]).model).eval()
        for extra in ([], ["model.channels_last=true"])
    )
    fast.load_state_dict(plain.state_dict())
    fast.configure_model()  # what the Trainer calls once the strategy is set up
    conv = next(m for m in fast.net.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    images = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(fast(images), plain(images))


@pytest.mark.parametrize(("preset", "strategy"), [("ddp", "DDPStrategy"), ("ddp_spawn", "SpawnDDPStrategy")])
def test_ddp_presets_on_cpu_are_two_processes(compose_cfg, preset, strategy):
    cfg = compose_cfg("train", [f"trainer={preset}", "trainer.accelerator=cpu", "trainer.devices=2"])
    trainer = instantiate(cfg.trainer, logger=False)
    assert trainer.world_size == 2 and type(trainer.strategy).__name__ == strategy


def test_fsdp_preset_builds_its_strategy_with_the_configured_policy(compose_cfg):
    from torch.distributed.fsdp import ShardingStrategy

    cfg = compose_cfg("train", ["trainer=fsdp", "trainer.strategy.sharding_strategy=SHARD_GRAD_OP"])
    strategy = instantiate(cfg.trainer.strategy)
    assert strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    wrap = strategy.kwargs["auto_wrap_policy"]  # wraps subtrees of at least min_num_params parameters
    assert wrap(torch.nn.Linear(1000, 1000), recurse=False, nonwrapped_numel=1_001_000)
    assert not wrap(torch.nn.Linear(10, 10), recurse=False, nonwrapped_numel=110)
    # Why preflight checks trainer=fsdp: Lightning itself refuses FSDP without a GPU.
    cfg = compose_cfg("train", ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2"])
    with pytest.raises(Exception, match=r"The strategy `fsdp` requires a GPU accelerator"):
        instantiate(cfg.trainer, logger=False)


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="the deepspeed extra is not installed"
)
def test_deepspeed_preset_builds_zero_stage_2_and_the_stage_is_a_key(compose_cfg):
    for stage_override, stage in ([], 2), (["trainer.strategy.stage=3"], 3):
        strategy = instantiate(compose_cfg("train", ["trainer=deepspeed", *stage_override]).trainer.strategy)
        assert strategy.config["zero_optimization"]["stage"] == stage


@pytest.mark.parametrize("preset", options("debug"))
def test_debug_presets_compose(compose_cfg, preset):
    cfg = compose_cfg("train", [f"debug={preset}"])
    assert cfg.task_name == "debug" and cfg.trainer.accelerator == "cpu"


@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiments_compose(compose_cfg, experiment):
    cfg = compose_cfg("train", [f"experiment={experiment}"])
    OmegaConf.resolve(cfg)
    assert cfg.tags


def test_a_group_entry_without_target_and_empty_enforced_tags_are_refused(compose_cfg):
    with pytest.raises(ValueError, match=r"callbacks.oops has no _target_"):
        instantiate_group(OmegaConf.create({"oops": {"monitor": "val/acc"}}), "callbacks")
    with pytest.raises(ValueError, match=r"tags is empty; label the run, e.g. tags=\[baseline\]"):
        apply_extras(compose_cfg("train", ["tags=[]"]))


# part: optuna
@pytest.mark.parametrize("search", options("hparams_search"))
def test_every_value_of_each_hparams_search_composes_into_a_model(search, data_dir):
    from optuna.distributions import CategoricalDistribution

    from hydra_plugins.optuna_sweeper.optuna_sweeper import OptunaSweeper, parse_search

    overrides = [f"hparams_search={search}", f"paths.data_dir={data_dir}"]
    cfg = api.compose("train", overrides)
    assert cfg.hydra.sweeper._target_ == f"{OptunaSweeper.__module__}.OptunaSweeper"
    assert cfg.hydra.sweeper.study_name == search
    assert cfg.callbacks.optuna_pruning.monitor == cfg.optimized_metric
    space, _ = parse_search(cfg.hydra.sweeper.params, [])
    assert space.distributions
    for key, dist in space.distributions.items():  # each choice, and both ends of each interval
        values = dist.choices if isinstance(dist, CategoricalDistribution) else (dist.low, dist.high)
        for value in values:
            trial_cfg = api.compose("train", [*overrides, space.override(key, value)])
            complete_config(trial_cfg)  # as a trial's run does
            instantiate(trial_cfg.data, _convert_="all")  # writes what the model may read (the example texts)
            assert isinstance(instantiate(trial_cfg.model), L.LightningModule)


# /part
