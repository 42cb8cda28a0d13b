"""The README's "How to add a dataset", done as a user would: a ClassificationDataModule subclass that
implements only `load_datasets()`, a data config that declares `num_classes` and `input_shape`, then train,
test, eval, predict and export through the real command line; for images (stripes) and for samples that are
not images (feature vectors).

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

# Three clusters in 16 features: samples that are feature vectors, not images (a table's rows, say).
FEATURES_MODULE = '''"""Three clusters of 16 features: a dataset whose samples are not images."""

import torch
from torch.utils.data import Dataset, TensorDataset

from src.data.classification_datamodule import ClassificationDataModule
from src.data.datamodule import seeded_split


class FeaturesDataModule(ClassificationDataModule):
    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        generator = torch.Generator().manual_seed(0)
        labels = torch.randint(0, 3, (300,), generator=generator)
        centres = 2 * torch.randn(3, 16, generator=generator)
        features = centres[labels] + torch.randn(300, 16, generator=generator)  # (N, 16)
        self._check_labels(labels)
        dataset = TensorDataset(features, labels)
        return seeded_split(dataset, self.hparams.split, self.hparams.split_seed, "features")
'''

FEATURES_CONFIG = """\
_target_: features.FeaturesDataModule
num_classes: 3
input_shape: [16]
split: [200, 50, 50]
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's project: stripes.py and features.py, and their configs in configs/data/."""
    root = tmp_path_factory.mktemp("project")
    (root / "configs" / "data").mkdir(parents=True)
    for name, module, config in (("stripes", MODULE, CONFIG), ("features", FEATURES_MODULE, FEATURES_CONFIG)):
        (root / f"{name}.py").write_text(module)
        (root / "configs" / "data" / f"{name}.yaml").write_text(config)
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
    assert checkpoint["datamodule_hyper_parameters"] is not None
    # part: predict
    # Only the subclass knows how its tensors were made: the checkpoint says so instead of guessing.
    assert checkpoint["hyper_parameters"]["preprocessing"] == {
        "datamodule": "stripes.StripesDataModule",
        "input_shape": [1, 8, 8],
        "image_mode": None,
        "transform": None,
    }
    # /part


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


@pytest.mark.slow
def test_a_dataset_of_feature_vectors_works_in_every_entry_point(
    project: Path, tmp_path: Path, data_dir: Path
):
    """Samples need not be images: with `input_shape: [16]` and model/net=mlp every entry point works. Eval's
    picture callback draws the confusion matrix, and no sample pictures, saying so once."""
    trained = run_in(
        project,
        "train",
        "data=features",
        "model/net=mlp",
        "trainer.max_epochs=2",
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = only_run_dir(tmp_path)
    test_acc = last_metrics(run)["test/acc"]
    assert test_acc >= 0.9

    best = run / "checkpoints" / "best.ckpt"
    evaluated = run_in(
        project,
        "eval",
        "data=features",
        "model/net=mlp",
        f"ckpt_path={best}",
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    eval_dir = only_run_dir(tmp_path, "eval")
    assert last_metrics(eval_dir)["test/acc"] == test_acc
    # part: diagnostics
    assert sorted(p.name for p in (eval_dir / "pictures").iterdir()) == ["test_confusion_matrix.png"]
    said = "callbacks.prediction_pictures: the inputs have shape [16], not [channels, height, width] images"
    assert (evaluated.stdout + evaluated.stderr).count(said) == 1
    # /part

    # part: predict
    predicted = run_in(project, "predict", f"run_dir={run}", log_dir=tmp_path, data_dir=data_dir)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    record = json.loads((only_run_dir(tmp_path, "predict") / "run.json").read_text())
    assert record["final_metrics"]["predict/acc"] == pytest.approx(test_acc, abs=1e-6)

    artifact = tmp_path / "features.pt2"
    exported = run_in(
        project,
        "export",
        f"run_dir={run}",
        "format=torch_export",
        f"output={artifact}",
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    sidecar = json.loads((tmp_path / "features.pt2.json").read_text())
    assert sidecar["input"]["shape"] == ["batch", 16]
    assert sidecar["parity"]["max_diff"] <= sidecar["parity"]["tolerance"]
    # /part


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
    assert module.hparams.class_names == ["0", "1"]
    # part: predict
    assert module.hparams.preprocessing == {
        "datamodule": "lightning.pytorch.core.datamodule.LightningDataModule",
        "transform": None,
    }
    with pytest.raises(
        ValueError, match=r"lightning.pytorch.core.datamodule.LightningDataModule does not say"
    ):
        file_loader([Path("photo.png")], module.hparams.preprocessing, batch_size=1)
    # /part
