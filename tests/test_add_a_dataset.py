"""The README's "How to add a dataset", done as a user would: a ClassificationDataModule subclass that
implements only `load_datasets()`, a data config that declares `num_classes` and `input_shape`, then train,
test, eval, predict and export through the real command line.

The user's project lives in tmp_path (the module on PYTHONPATH, its config on Hydra's search path), so the
test leaves no file in the repository.
"""

import json  # [part: predict]
from pathlib import Path
from types import SimpleNamespace

import numpy as np  # [part: predict]
import pytest
import torch
from lightning import LightningDataModule
from PIL import Image  # [part: predict]

from src.inference.inputs import file_loader  # [part: predict]
from src.models.classifier_module import ClassifierModule
from src.run.trained_run import TrainedRun, load_model  # [part: predict]
from tests.conftest import last_metrics, only_run_dir, run_cli

# Stripes: 8x8 images of horizontal (class 0) or vertical (class 1) stripes under noise; an MLP learns them
# in a few epochs.
MODULE = '''"""Stripes in noise: a dataset made of tensors, not of image files."""

import torch
from torch.utils.data import Dataset, TensorDataset

from src.data.classification_datamodule import ClassificationDataModule


class StripesDataModule(ClassificationDataModule):
    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        generator = torch.Generator().manual_seed(0)
        vertical = (torch.arange(8) % 2).float().expand(8, 8)

        def stripes(count: int) -> TensorDataset:
            labels = torch.randint(0, 2, (count,), generator=generator)
            clean = torch.where(labels.view(-1, 1, 1) == 0, vertical.T, vertical)
            noise = 0.5 * torch.randn(count, 8, 8, generator=generator)
            return TensorDataset((clean + noise).unsqueeze(1), labels)

        return stripes(256), stripes(64), stripes(64)
'''

CONFIG = """\
_target_: stripes.StripesDataModule
num_classes: 2
input_shape: [1, 8, 8]
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's project: stripes.py and configs/data/stripes.yaml."""
    root = tmp_path_factory.mktemp("project")
    (root / "stripes.py").write_text(MODULE)
    (root / "configs" / "data").mkdir(parents=True)
    (root / "configs" / "data" / "stripes.yaml").write_text(CONFIG)
    return root


def run_in(project: Path, script: str, *overrides: str, log_dir: Path, data_dir: Path):
    """`python src/<script>.py data=stripes ...` with the user's module importable and config findable."""
    search_path = f"hydra.searchpath=[file://{project / 'configs'}]"
    return run_cli(
        script,
        search_path,
        *overrides,
        log_dir=log_dir,
        data_dir=data_dir,
        env={"PYTHONPATH": str(project)},
    )


@pytest.fixture(scope="module")
def trained(project: Path, tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """`python src/train.py data=stripes model/net=mlp`: trains, tests the best checkpoint; its run dir."""
    log_dir = tmp_path_factory.mktemp("logs")
    result = run_in(
        project,
        "train",
        "data=stripes",
        "model/net=mlp",
        "trainer.max_epochs=4",
        log_dir=log_dir,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run_dir(log_dir)


@pytest.mark.slow
def test_a_subclass_with_only_load_datasets_trains_tests_and_checkpoints(trained: Path):
    metrics = last_metrics(trained)
    assert metrics["val/acc_best"] >= 0.9 and metrics["test/acc"] >= 0.9
    assert (trained / "checkpoints" / "best.ckpt").is_file() and (
        trained / "checkpoints" / "last.ckpt"
    ).is_file()
    checkpoint = torch.load(trained / "checkpoints" / "best.ckpt", weights_only=True)
    # Only the subclass knows how its tensors were made: the checkpoint says so instead of guessing.
    assert checkpoint["hyper_parameters"]["preprocessing"] == {
        "datamodule": "stripes.StripesDataModule",
        "input_shape": [1, 8, 8],
        "image_mode": None,
        "collate": "stack",
        "transform": None,
    }


@pytest.mark.slow
def test_its_checkpoint_evaluates_to_the_training_runs_test_accuracy(
    project: Path, trained: Path, tmp_path: Path, data_dir: Path
):
    best = trained / "checkpoints" / "best.ckpt"
    result = run_in(
        project,
        "eval",
        "data=stripes",
        "model/net=mlp",
        f"ckpt_path={best}",
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert last_metrics(only_run_dir(tmp_path, "eval"))["test/acc"] == last_metrics(trained)["test/acc"]


# part: predict
@pytest.mark.slow
def test_predict_and_export_work_on_its_test_split(
    project: Path, trained: Path, tmp_path: Path, data_dir: Path
):
    predicted = run_in(project, "predict", f"run_dir={trained}", log_dir=tmp_path, data_dir=data_dir)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    out = only_run_dir(tmp_path, "predict")
    accuracy = json.loads((out / "run.json").read_text())["final_metrics"]["predict/acc"]
    assert accuracy == pytest.approx(last_metrics(trained)["test/acc"], abs=1e-6)

    artifact = tmp_path / "stripes.pt"
    exported = run_in(
        project,
        "export",
        f"run_dir={trained}",
        "format=state_dict",
        f"output={artifact}",
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    sidecar = json.loads((tmp_path / "stripes.pt.json").read_text())
    assert sidecar["input"]["shape"] == ["batch", 1, 8, 8]
    assert sidecar["input"]["preprocessing"] is None  # not known, and not guessed


@pytest.mark.slow
def test_image_files_are_refused_naming_the_datamodule_and_what_to_implement(trained: Path, tmp_path: Path):
    model = load_model(TrainedRun(trained / "checkpoints" / "best.ckpt", None))
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(tmp_path / "photo.png")
    with pytest.raises(
        ValueError,
        match=r"stripes.StripesDataModule does not say how an image file becomes the net's input; implement "
        r"inference_preprocessing\(\) in it",
    ):
        file_loader([tmp_path / "photo.png"], model.hparams.preprocessing, batch_size=1)


# /part


def test_any_lightning_datamodule_is_recorded_as_one_that_does_not_say_how_to_read_files():
    """The README also allows "any LightningDataModule": without inference_preprocessing() it still trains."""
    module = ClassifierModule(
        net={"_target_": "torch.nn.Flatten"},
        optimizer={"_target_": "torch.optim.Adam", "_partial_": True},
        num_classes=2,
    )
    module._trainer = SimpleNamespace(datamodule=LightningDataModule())  # what trainer.fit attaches
    module.setup("fit")
    assert module.hparams.preprocessing == {
        "datamodule": "lightning.pytorch.core.datamodule.LightningDataModule",
        "transform": None,
    }
    assert module.hparams.class_names == ["0", "1"]
    # part: predict
    with pytest.raises(
        ValueError, match=r"lightning.pytorch.core.datamodule.LightningDataModule does not say"
    ):
        file_loader([Path("photo.png")], module.hparams.preprocessing, batch_size=1)
    # /part
