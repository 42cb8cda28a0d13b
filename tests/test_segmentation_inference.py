"""Predict and export with a segmentation run: masks and previews at each image's own size, the test metrics
on the test split, exports that pass their parity check with a dynamic batch, and what a task module must
implement for either."""

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from PIL import Image
from torchmetrics.classification import MulticlassAccuracy

from src import api
from src.data.digit_scenes_datamodule import CLASS_NAMES
from src.inference import export_formats
from src.models.task_module import TaskModule
from src.run.trained_run import TrainedRun, load_model
from tests.conftest import last_metrics, paths

SEGMENTER = "module=src.models.segmenter_module.SegmenterModule"


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as file:
        return list(csv.DictReader(file))


def mask_of(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        assert image.mode == "L", f"{path} is {image.mode}, not 8-bit single-channel"
        return np.asarray(image)


@pytest.fixture(scope="module")
def scene_files(segment_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's first test scene as PNG files: as it is (64x64), resized to 70 wide x 50 high, and a 33x47
    crop in RGB (the checkpoint's preprocessing makes it grayscale and 64x64)."""
    config = json.loads((segment_run / "run.json").read_text())["config"]["data"]
    with np.load(instantiate(config).cache_file) as cached:  # the scenes the run was tested on, as uint8
        scene = cached["test_scenes"][0]
    folder = tmp_path_factory.mktemp("scene_files")
    Image.fromarray(scene).save(folder / "scene.png")
    Image.fromarray(scene).resize((70, 50)).save(folder / "wide.png")
    Image.fromarray(np.stack([scene[:47, :33]] * 3, axis=-1)).save(folder / "colour.png")
    return folder


@pytest.fixture(scope="module")
def test_split_prediction(
    segment_run: Path, tmp_path_factory: pytest.TempPathFactory, data_dir: Path
) -> Path:
    """`python src/predict.py run_dir=<the segmentation run>`: its test split; the predict run's dir."""
    where = paths(tmp_path_factory.mktemp("predict_test_split"), data_dir)
    where = [override for override in where if not override.startswith("logger=")]  # predict has no logger
    return api.predict([*where, f"run_dir={segment_run}"]).run_dir


def test_predict_on_the_test_split_gives_the_test_metrics(segment_run: Path, test_split_prediction: Path):
    out = test_split_prediction
    rows = read_csv(out / "predictions.csv")
    assert len(rows) == 64  # the small test split (conftest.SMALL_SCENES)
    assert [row["mask"] for row in rows[:2]] == ["masks/00000.png", "masks/00001.png"]  # named by index
    for row in rows:
        assert mask_of(out / row["mask"]).shape == (64, 64) and (out / row["preview"]).is_file()
        assert 0 <= float(row["acc"]) <= 1 and 0 <= float(row["miou"]) <= 1
        assert sum(float(row[f"share_{name}"]) for name in CLASS_NAMES) == pytest.approx(1)
    # The same checkpoint (best.ckpt) as the training run's test, the same 64 scenes, and the test's own metric
    # objects (SegmenterModule.stage_metrics). Where the run tested in bf16 (experiment=segment_digits on a CPU
    # with AVX-512 BF16), predict runs in float32: a few pixels near a boundary change class, so the values
    # agree to bf16's rounding.
    # (test_segmentation.py checks that eval.py, which follows the run's precision, gives them exactly.)
    predicted = json.loads((out / "run.json").read_text())["final_metrics"]
    tested = last_metrics(segment_run)
    names = ["miou", "acc", "dice", *(f"iou_{name}" for name in CLASS_NAMES)]
    for name in names:
        assert predicted[f"predict/{name}"] == pytest.approx(tested[f"test/{name}"], rel=5e-3, abs=1e-3), name
    # Every scene has 64x64 labelled pixels: the overall pixel accuracy is the mean of the images'.
    mean_acc = np.mean([float(row["acc"]) for row in rows])
    assert predicted["predict/acc"] == pytest.approx(mean_acc, rel=1e-6)


def test_predict_on_image_files_writes_a_mask_and_a_preview_at_each_files_size(
    segment_run: Path,
    scene_files: Path,
    test_split_prediction: Path,
    tmp_path: Path,
    here_for_inference: list[str],
):
    checkpoint = tmp_path / "elsewhere" / "seg.ckpt"  # outside any run dir: the checkpoint alone
    checkpoint.parent.mkdir()
    shutil.copy(segment_run / "checkpoints" / "best.ckpt", checkpoint)
    args = [f"ckpt_path={checkpoint}", f"inputs={scene_files}"]
    out = api.predict([*here_for_inference, *args, SEGMENTER]).run_dir
    rows = read_csv(out / "predictions.csv")
    assert list(rows[0]) == [
        "index", "file", "mask", "preview", "height", "width", *(f"share_{name}" for name in CLASS_NAMES)
    ]  # fmt: skip
    assert [Path(row["file"]).name for row in rows] == ["colour.png", "scene.png", "wide.png"]
    for row in rows:
        with Image.open(row["file"]) as image:
            width, height = image.size
        mask = mask_of(out / row["mask"])
        assert mask.shape == (height, width) == (int(row["height"]), int(row["width"]))
        assert set(np.unique(mask)) <= set(range(11))
        with Image.open(out / row["preview"]) as preview:
            assert preview.mode == "RGB" and preview.size == (width, height)
    assert [row["mask"] for row in rows] == [
        "masks/00000_colour.png",
        "masks/00001_scene.png",
        "masks/00002_wide.png",
    ]
    detailed = json.loads((out / "predictions.json").read_text())
    assert all(sum(row["class_shares"].values()) == pytest.approx(1) for row in detailed)
    assert "predict/miou" not in json.loads((out / "run.json").read_text())["final_metrics"]  # no labels
    # A file at the net's own size is preprocessed as the test split was: the same mask as the scene's there.
    assert np.array_equal(mask_of(out / rows[1]["mask"]), mask_of(test_split_prediction / "masks/00000.png"))


@pytest.mark.parametrize("fmt", ["onnx", "torch_export"])
@pytest.mark.slow
def test_segmenter_exports_pass_their_parity_check_with_a_dynamic_batch(
    segment_run: Path, tmp_path: Path, here_for_inference: list[str], fmt: str
):
    artifact = tmp_path / f"unet.{fmt}"
    args = [f"run_dir={segment_run}", f"format={fmt}", f"output={artifact}"]
    exported = api.export([*here_for_inference, *args])
    assert "Parity check passed" in (exported.run_dir / "export.log").read_text()
    sidecar = json.loads(artifact.with_name(artifact.name + ".json").read_text())
    assert sidecar["input"]["shape"] == ["batch", 1, 64, 64]
    output = sidecar["output"]
    assert output["name"] == "logits" and output["shape"] == ["batch", 11, 64, 64]
    assert "per-pixel logits" in output["meaning"]
    assert output["softmax_for"] == "probabilities (over dim 1)"
    assert output["argmax_for"] == "class indices (over dim 1)"
    assert sidecar["class_names"] == CLASS_NAMES
    # The U-Net pads its input to a multiple of 8 and crops its output back: the batch axis stays dynamic.
    model = load_model(TrainedRun(segment_run / "checkpoints" / "best.ckpt", None), SEGMENTER.split("=")[1])
    images = torch.randn(3, 1, 64, 64)  # a batch size the export and its check did not use
    run = export_formats.FORMATS[fmt].load(artifact, sidecar["net"])
    with torch.no_grad():
        got, expected = run(images), model(images)
    assert got.shape == (3, 11, 64, 64) and torch.allclose(got, expected, atol=1e-5)


@pytest.mark.slow
def test_a_broken_segmenter_export_fails_its_parity_check(
    segment_run: Path, tmp_path: Path, here_for_inference: list[str]
):
    artifact = tmp_path / "unet.onnx"
    strict = ["format=onnx", f"output={artifact}", "tolerance=1e-12"]  # ONNX Runtime differs by ~1e-7
    with pytest.raises(
        ValueError, match=r"failed its parity check: its outputs differ from the model's by up to"
    ):
        api.export([*here_for_inference, f"run_dir={segment_run}", *strict])
    assert not [*tmp_path.glob("unet.onnx*"), *tmp_path.glob(".unet.onnx*")]  # nothing of it is kept
    # An artifact that crops the U-Net's output wrong fails on its shape.
    model = load_model(TrainedRun(segment_run / "checkpoints" / "best.ckpt", None), SEGMENTER.split("=")[1])
    with pytest.raises(
        ValueError, match=r"gives outputs of shape \[4, 11, 63, 64\], the model \[4, 11, 64, 64\]"
    ):
        export_formats.check_parity(
            model, lambda x: model(x)[..., :63, :], torch.randn(4, 1, 64, 64), 1e-5, "cropped"
        )


class MySegmenter(TaskModule):
    """A segmenter written on TaskModule: it trains and tests, and says nothing yet for predict and export."""

    task = "segmentation"

    def stage_metrics(self, stage):
        classes, ignore = self.hparams.num_classes, self.hparams.ignore_index
        return {"acc": MulticlassAccuracy(classes, average="micro", ignore_index=ignore)}

    def step(self, batch):
        logits = self(batch[0])
        return F.cross_entropy(logits, batch[1].long()), logits.argmax(dim=1), batch[1]


@pytest.mark.parametrize(
    ("task", "method"), [("predict", "prediction_writer"), ("export", "output_description")]
)
def test_a_task_module_without_the_predict_and_export_hooks_is_told_what_to_implement(
    segment_run: Path,
    scene_files: Path,
    tmp_path: Path,
    here_for_inference: list[str],
    task: str,
    method: str,
):
    shutil.copy(segment_run / "checkpoints" / "best.ckpt", tmp_path / "seg.ckpt")  # it loads these weights
    mine = "module=tests.test_segmentation_inference.MySegmenter"  # a user's own class, by its import path
    args = [f"ckpt_path={tmp_path / 'seg.ckpt'}", mine, f"inputs={scene_files}"]
    with pytest.raises(NotImplementedError, match=r"^MySegmenter does not say") as refused:
        getattr(api, task)([*here_for_inference, *args])
    assert f"implement {method}() in it (see TaskModule in src/models/task_module.py)" in str(refused.value)
    assert "\n" not in str(refused.value)  # one line
    # Refused before anything was written: no predictions, no artifact beside the checkpoint.
    assert not list(tmp_path.glob("**/predictions.csv")) and [p.name for p in tmp_path.glob("seg.*")] == [
        "seg.ckpt"
    ]


def test_a_segmentation_checkpoint_outside_its_run_is_refused_for_a_classifier(
    segment_run: Path, scene_files: Path, tmp_path: Path, here_for_inference: list[str]
):
    shutil.copy(segment_run / "checkpoints" / "best.ckpt", tmp_path / "seg.ckpt")
    args = [f"ckpt_path={tmp_path / 'seg.ckpt'}", f"inputs={scene_files}"]  # module= left at its default
    refusal = (
        "was trained on segmentation data but module=src.models.classifier_module.ClassifierModule is a "
        "classification module; give module=<the LightningModule class it was trained with>"
    )
    with pytest.raises(ValueError, match=re.escape(refusal)):
        api.predict([*here_for_inference, *args])
