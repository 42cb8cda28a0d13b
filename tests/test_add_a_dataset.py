"""The README's "How to add a dataset", done as a user would: a ClassificationDataModule subclass that
implements only `load_datasets()`, a data config that declares `num_classes` and `input_shape` (or a class
method that fills in what follows from the data), then train, test, eval, predict and export, for images
(stripes) and for samples that are not images (feature vectors).
The user's project lives in tmp_path (its modules importable, its configs on Hydra's search path)."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np  # [part: predict]
import pytest
import torch
from lightning import LightningDataModule
from PIL import Image  # [part: predict]

from src import api
from src.inference.inputs import file_loader  # [part: predict]
from src.models.classifier_module import ClassifierModule
from src.run.trained_run import TrainedRun, data_task, load_model  # [part: predict]
from tests.conftest import paths

# Stripes: 8x8 images of horizontal (class 0) or vertical (class 1) stripes under noise; an MLP learns them
# in a few epochs.
STRIPES = '''"""Stripes in noise: a dataset made of tensors, not of image files."""

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

# Three clusters in 16 features: samples that are feature vectors, not images (a table's rows, say).
FEATURES = '''"""Three clusters of 16 features: a dataset whose samples are not images."""

import torch
from torch.utils.data import Dataset, TensorDataset

from src.data.classification_datamodule import ClassificationDataModule
from src.data.datamodule import seeded_split


class FeaturesDataModule(ClassificationDataModule):
    @classmethod
    def complete_config(cls, cfg) -> None:
        if cfg.data.input_shape is None:  # the data knows how many features it has
            cfg.data.input_shape = [16]

    def load_datasets(self) -> tuple[Dataset, Dataset, Dataset]:
        generator = torch.Generator().manual_seed(0)
        labels = torch.randint(0, 3, (300,), generator=generator)
        centres = 2 * torch.randn(3, 16, generator=generator)
        features = centres[labels] + torch.randn(300, 16, generator=generator)  # (N, 16)
        self._check_labels(labels)
        dataset = TensorDataset(features, labels)
        return seeded_split(dataset, self.hparams.split, self.hparams.split_seed, "features")
'''

STRIPES_CONFIG = "_target_: stripes.StripesDataModule\nnum_classes: 2\ninput_shape: [1, 8, 8]\n"
FEATURES_CONFIG = (
    "_target_: features.FeaturesDataModule\nnum_classes: 3\ninput_shape: null\nsplit: [200, 50, 50]\n"
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A user's project: stripes.py and features.py importable, their configs in its configs/data/. Its value:
    the override that puts those configs on Hydra's search path."""
    root = tmp_path_factory.mktemp("project")
    (root / "configs" / "data").mkdir(parents=True)
    for name, module, config in (
        ("stripes", STRIPES, STRIPES_CONFIG),
        ("features", FEATURES, FEATURES_CONFIG),
    ):
        (root / f"{name}.py").write_text(module)
        (root / "configs" / "data" / f"{name}.yaml").write_text(config)
    sys.path.insert(0, str(root))
    yield [f"hydra.searchpath=[file://{root / 'configs'}]"]
    sys.path.remove(str(root))


@pytest.fixture(scope="module")
def trained(project: list[str], tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> api.Result:
    """`python src/train.py data=stripes model/net=mlp`: trains, then tests the best checkpoint."""
    here = paths(tmp_path_factory.mktemp("logs"), data_dir)
    return api.train([*here, *project, "data=stripes", "model/net=mlp", "trainer.max_epochs=4"])


@pytest.mark.slow
def test_a_subclass_with_only_load_datasets_trains_tests_and_checkpoints(trained: api.Result):
    assert trained.metrics["val/acc_best"] >= 0.9 and trained.metrics["test/acc"] >= 0.9
    assert (trained.run_dir / "checkpoints" / "last.ckpt").is_file()
    checkpoint = torch.load(trained.run_dir / "checkpoints" / "best.ckpt", weights_only=True)
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
def test_a_dataset_of_feature_vectors_works_in_every_entry_point(
    project: list[str], here: list[str], here_for_inference: list[str], tmp_path: Path
):
    """Samples need not be images: with `input_shape: [16]` (its config leaves it null: the datamodule fills it
    in, and the run records it) and model/net=mlp every entry point works, and its checkpoint evaluates to the
    training run's test accuracy. Eval's picture callback draws the confusion matrix, and no sample pictures,
    saying so once."""
    run = api.train([*here, *project, "data=features", "model/net=mlp", "trainer.max_epochs=2"])
    assert run.metrics["test/acc"] >= 0.9
    assert json.loads((run.run_dir / "run.json").read_text())["config"]["data"]["input_shape"] == [16]
    best = run.run_dir / "checkpoints" / "best.ckpt"
    evaluated = api.evaluate([*here, *project, "data=features", "model/net=mlp", f"ckpt_path={best}"])
    assert evaluated.metrics["test/acc"] == run.metrics["test/acc"]
    # part: diagnostics
    assert sorted(p.name for p in (evaluated.run_dir / "pictures").iterdir()) == ["test_confusion_matrix.png"]
    said = "callbacks.prediction_pictures: the inputs have shape [16], not [channels, height, width] images"
    assert (evaluated.run_dir / "eval.log").read_text().count(said) == 1
    # /part
    # part: predict
    inference = [*here_for_inference, *project, f"run_dir={run.run_dir}"]
    predicted = api.predict(inference)
    assert predicted.metrics["predict/acc"] == pytest.approx(run.metrics["test/acc"], abs=1e-6)
    api.export([*inference, "format=torch_export", f"output={tmp_path / 'features.pt2'}"])
    sidecar = json.loads((tmp_path / "features.pt2.json").read_text())
    assert sidecar["input"]["shape"] == ["batch", 16]
    assert sidecar["parity"]["max_diff"] <= sidecar["parity"]["tolerance"]
    # /part


# part: predict
@pytest.mark.slow
def test_predict_and_export_work_on_its_test_split(
    trained: api.Result, project: list[str], here_for_inference: list[str], tmp_path: Path
):
    inference = [*here_for_inference, *project, f"run_dir={trained.run_dir}"]
    predicted = api.predict(inference)
    assert predicted.metrics["predict/acc"] == pytest.approx(trained.metrics["test/acc"], abs=1e-6)
    api.export([*inference, "format=state_dict", f"output={tmp_path / 'stripes.pt'}"])
    sidecar = json.loads((tmp_path / "stripes.pt.json").read_text())
    assert sidecar["input"]["shape"] == ["batch", 1, 8, 8]
    assert sidecar["input"]["preprocessing"] is None  # not known, and not guessed


@pytest.mark.slow
def test_image_files_are_refused_naming_the_datamodule_and_what_to_implement(
    trained: api.Result, tmp_path: Path
):
    model = load_model(TrainedRun(trained.run_dir / "checkpoints" / "best.ckpt", None))
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


# part: predict
def test_a_checkpoint_says_its_datamodules_task_or_none_where_that_cannot_be_imported():
    assert data_task("src.data.digits_datamodule.DigitsDataModule") == "classification"
    for elsewhere in ("my_lab.data.CellsDataModule", "CellsDataModule", None):  # not here, no module, none
        assert data_task(elsewhere) is None


# /part
