"""Every option of every config group runs, on a fresh install, as a user runs it: `python src/train.py
-m debug=fdr <group>=<each option>` (one batch of each stage per option; one process per group, so the
imports are paid once). The data options train in tests/test_data.py; here, those that need something first.
Loggers walk with debug=limit instead: fast_dev_run swaps every logger for a dummy, which would hide a logger
that fails at its first write (as a tracking store's file store once did). An option that needs something first (a GPU, a
download, a login, its own data) fails with a message that says what; the test lists those with the words
they must say.

A new YAML file in a group is picked up by itself: it must run, or be listed below with its message.
`extras` and `paths` have one option each, `default`, which every run here uses.
"""

import csv
from pathlib import Path

import pytest
import torch

from tests.conftest import CONFIG_DIR, ROOT, last_metrics, run_cli

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
    "debug": ["data=digits", "model/net=mlp"],  # the presets themselves, on the digits MLP (seconds each);
    # tests/test_data.py runs debug=overfit on every data option
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
    ("trainer", "fsdp"): "needs CUDA GPUs",
    ("trainer", "deepspeed"): "needs CUDA GPUs",
}
if torch.cuda.is_available():  # on a GPU machine these run
    NEEDS_SOMETHING = {key: value for key, value in NEEDS_SOMETHING.items() if key[0] != "trainer"}


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


def walk(group: str, choices: list[str], *overrides: str, tmp_path: Path, data_dir: Path) -> dict[str, dict]:
    """Run one multirun over `choices` of `group`; return each job's row of the sweep summary."""
    if not choices:  # e.g. the data options that need something, in a project generated without them
        return {}
    result = run_cli(
        "train",
        "-m",
        f"{group}={','.join(choices)}",
        *overrides,
        log_dir=tmp_path,
        data_dir=data_dir,
        timeout=600,
    )
    (sweep,) = (tmp_path / "debug" / "multiruns").iterdir()
    with open(sweep / "summary.csv") as file:
        rows = {row[group]: row | {"dir": sweep / row["job"]} for row in csv.DictReader(file)}
    assert sorted(rows) == sorted(choices), result.stderr[-3000:]
    return rows


# Options walked apart from the group's others, with the overrides a user gives them: a key the group's other
# options lack, or the data and model of another task than the default classification.
SEGMENTATION = ["data=digit_scenes", "model=segmenter"]  # [part: segmentation]
# part: text
# The example texts, and a net from scratch with their tokenizer.
TEXTS = [
    "data=example_texts",
    "model=text_classifier",
    "model.net.tokenizer=${paths.data_dir}/example_texts/tokenizer",
]
# /part
ALONE = {
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
    choices = [
        option for option in options(group) if (group, option) not in ALONE.keys() | RUN_IN_FULL.keys()
    ]
    if group == "data":  # each trains with debug=overfit in tests/test_data.py, on files it writes first
        choices = [option for option in choices if (group, option) in NEEDS_SOMETHING]
    rows = walk(group, choices, *GROUPS[group], tmp_path=tmp_path / "together", data_dir=data_dir)
    apart: dict[tuple[str, ...], list[str]] = {}  # options that share their overrides are walked together
    for (alone_group, option), overrides in ALONE.items():
        if option not in options(alone_group):  # an option of a part this project was generated without
            continue
        if alone_group == group and (group != "data" or (group, option) in NEEDS_SOMETHING):
            apart.setdefault(tuple(overrides), []).append(option)
    for i, (overrides, together) in enumerate(apart.items()):
        rows |= walk(
            group, together, *GROUPS[group], *overrides, tmp_path=tmp_path / f"apart{i}", data_dir=data_dir
        )
    needing = {option for needs_group, option in NEEDS_SOMETHING if needs_group == group}
    assert needing & set(options(group)) <= rows.keys()
    problems = []
    for option, row in rows.items():
        needs = NEEDS_SOMETHING.get((group, option))
        if needs is None and row["status"] != "completed":
            problems.append(f"{group}={option} failed: {row['error']}")
        elif needs is not None and needs not in row["error"]:
            problems.append(f"{group}={option}: expected an error saying {needs!r}, got {row['error']!r}")
    assert not problems, "\n".join(problems)
    if group == "debug":  # what the overfit preset is for: the model memorises its 3 batches
        assert last_metrics(rows["overfit"]["dir"])["train/acc"] > 0.95


# part: optuna
@pytest.mark.slow
@pytest.mark.parametrize("search", options("hparams_search"))
def test_every_hparams_search_runs_a_trial(search: str, tmp_path: Path, data_dir: Path):
    result = run_cli(
        "train", "-m", f"hparams_search={search}", "hydra.sweeper.n_trials=1", "trainer.max_epochs=1",
        "+trainer.limit_train_batches=2", "+trainer.limit_val_batches=1", "+trainer.limit_test_batches=1",
        log_dir=tmp_path, data_dir=data_dir, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "train" / "studies" / search / "summary.csv") as file:
        assert [row["status"] for row in csv.DictReader(file)] == ["completed"]


# /part


def test_the_groups_not_walked_have_only_the_option_every_walk_uses():
    # A second option in one of these is walked by adding the group to GROUPS. Not walked either: the
    # searches (the test above), your machine's settings (local/) and Hydra's own settings (hydra/: the
    # sweeper runs in the searches; launcher=slurm needs a SLURM cluster).
    assert options("extras") == options("paths") == ["default"]
    groups = {path.parent.relative_to(CONFIG_DIR).as_posix() for path in CONFIG_DIR.glob("*/**/*.yaml")}
    others = {"extras", "paths", "hydra"}
    others.add("hparams_search")  # [part: optuna]
    others.add("hydra/sweeper")  # [part: optuna]
    others.add("hydra/launcher")  # [part: cluster]
    assert groups - set(GROUPS) - {"local"} == others
