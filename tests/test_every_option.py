"""Every option of every config group runs one batch of each stage (`api.train(["debug=fdr", "<group>=<option>"])`),
or says what it needs first (a GPU, a download, its own data): a new YAML file in a group must run, or be
listed below with the words its error must say. Loggers run with debug=limit: fast_dev_run swaps every logger
for a dummy, which would hide one that fails at its first write."""

import math  # [part: optuna]
from pathlib import Path

import optuna  # [part: optuna]
import pytest
import torch
from hydra.utils import instantiate  # [part: optuna]

from hydra_plugins.optuna_sweeper.optuna_sweeper import parse_search  # [part: optuna]
from src import api
from tests.conftest import CONFIG_DIR, ROOT, last_metrics, paths

# Groups whose options are walked, and the overrides each walk adds.
FDR = ["debug=fdr"]
GROUPS = {
    "data": FDR,  # only the options that need something first: tests/test_data.py trains every data option
    "model": FDR,
    "model/net": FDR,
    "model/optimizer": FDR,
    "model/scheduler": FDR,
    "callbacks": FDR,
    "logger": ["debug=limit", "trainer.max_epochs=1", "data=digits", "model/net=mlp"],
    "trainer": FDR,
    "experiment": FDR,
    "debug": ["data=digits", "model/net=mlp"],  # the presets themselves, on the digits MLP (seconds each)
}
# Options that cannot run here, and what their error must say so that the user knows what to do first.
NEEDS_SOMETHING = {
    ("data", "mnist"): "could not be downloaded",  # the full MNIST: a download, no network  [part: mnist]
    ("data", "image_folder"): "data.image_dir",  # your own images: say where they are  [part: folders]
    # part: segmentation, folders
    ("data", "segmentation_folder"): "data.image_dir",  # your own images and masks, likewise
    # /part
    ("data", "streaming"): "data.input_dir",  # shards: write them first (src/shard.py)  [part: streaming]
    ("data", "text_file"): "data.train_file",  # your own texts: say where they are  [part: text]
    # the strategies that only CUDA GPUs run
    ("trainer", "fsdp"): "needs CUDA GPUs",
    ("trainer", "deepspeed"): "needs CUDA GPUs",
}
if torch.cuda.is_available():  # on a GPU machine these run
    NEEDS_SOMETHING = {key: value for key, value in NEEDS_SOMETHING.items() if key[0] != "trainer"}


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


# Options run with overrides of their own, as a user gives them: a key the group's other options lack, or the
# data and model of another task than the default classification.
SEGMENTATION = ["data=digit_scenes", "model=segmenter"]  # [part: segmentation]
# part: text
# The example texts, and a net from scratch, which takes their tokenizer.
TEXTS = ["data=example_texts", "model=text_classifier"]
# /part
OWN_OVERRIDES = {
    ("logger", "wandb"): ["logger.wandb.offline=true"],  # no wandb login here: offline, as documented
    # part: segmentation
    ("data", "digit_scenes"): ["model=segmenter"],
    ("data", "segmentation_folder"): ["model=segmenter"],  # [part: folders]
    ("model", "segmenter"): ["data=digit_scenes"],
    ("model/net", "unet"): SEGMENTATION,
    ("model/net", "lraspp"): SEGMENTATION,  # [part: pretrained]
    # /part
    ("data", "example_texts"): TEXTS,  # [part: text]
    # part: folders, pretrained
    # Its pretrained weights are a download (no network here): from scratch, as its comment says to offline.
    ("experiment", "finetune_images"): ["model.net.pretrained=false"],
    # /part
}


# Options that another test runs in full, with more than one batch of each stage: not walked again here.
RUN_IN_FULL = {("trainer", "ddp_spawn"): "tests/test_ddp.py"}  # two spawned processes, metrics synced
# part: text
RUN_IN_FULL[("model", "text_classifier")] = "tests/test_text.py"  # trained, evaluated, resumed, with LoRA
RUN_IN_FULL[("model/net", "hf")] = "tests/test_text.py"
# /part


def test_the_options_run_in_full_elsewhere_are_run_there():
    for (group, option), test_file in RUN_IN_FULL.items():
        assert f'"{group}={option}"' in (ROOT / test_file).read_text(), (group, option)


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_the_group_runs_or_says_what_it_needs(group: str, tmp_path: Path, data_dir: Path):
    problems = []
    for option in options(group):
        needs = NEEDS_SOMETHING.get((group, option))
        if (group, option) in RUN_IN_FULL or (group == "data" and needs is None):  # trained elsewhere
            continue
        overrides = [f"{group}={option}", *GROUPS[group], *OWN_OVERRIDES.get((group, option), [])]
        try:
            run = api.train([*paths(tmp_path / option, data_dir), *overrides])
        except Exception as error:  # what it says is what is checked
            if needs is None or needs not in str(error):
                problems.append(f"{group}={option}: expected to {needs or 'run'}, got {error!r}")
            continue
        if needs is not None:
            problems.append(f"{group}={option} ran; expected an error saying {needs!r}")
        elif option == "overfit" and group == "debug":  # what the preset is for: it memorises its 3 batches
            assert last_metrics(run.run_dir)["train/acc"] > 0.95
    assert not problems, "\n".join(problems)


# part: optuna
@pytest.mark.slow
@pytest.mark.parametrize("search", options("hparams_search"))
def test_every_hparams_search_runs_a_trial(search: str, tmp_path: Path, data_dir: Path):
    # The search's first trial as its sweeper draws and overrides it (the sweeper itself: test_optuna.py),
    # trained here: its values must be ones the config takes, and it must log what it returns to the study.
    cfg = api.compose("train", [f"hparams_search={search}"])
    sweeper = instantiate(cfg.hydra.sweeper)  # its settings, sampler and pruner too, checked
    space, fixed = parse_search(sweeper.params, [])
    study = optuna.create_study(sampler=instantiate(sweeper.sampler), pruner=instantiate(sweeper.pruner))
    trial = study.ask(space.distributions)
    values = [space.override(key, value) for key, value in trial.params.items()]
    limits = [f"+trainer.limit_{stage}_batches={n}" for stage, n in (("train", 2), ("val", 1), ("test", 1))]
    overrides = [f"hparams_search={search}", *fixed, *values, "trainer.max_epochs=1", *limits]
    run = api.train([*paths(tmp_path, data_dir), *overrides])
    assert math.isfinite(run.metrics[cfg.optimized_metric])  # also what its pruning callback reports


# /part


def test_the_groups_not_walked_have_only_the_option_every_walk_uses():
    # A second option in one of these is walked by adding the group to GROUPS. Not walked: your machine's
    # settings (local/) and Hydra's own (hydra/; launcher=slurm needs a SLURM cluster).
    assert options("extras") == options("paths") == ["default"]
    groups = {path.parent.relative_to(CONFIG_DIR).as_posix() for path in CONFIG_DIR.glob("*/**/*.yaml")}
    others = {"extras", "paths", "hydra"}
    others.add("hparams_search")  # [part: optuna]
    others.add("hydra/sweeper")  # [part: optuna]
    others.add("hydra/launcher")  # [part: cluster]
    assert groups - set(GROUPS) - {"local"} == others
