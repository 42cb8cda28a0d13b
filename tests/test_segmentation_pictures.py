"""Pictures of a segmentation run (src/callbacks/segmentation_pictures.py): sample overlays and the per-class IoU,
sent to TensorBoard and saved as PNGs, at training with `'callbacks=[default,segmentation_pictures]'` and at
eval always; eval of a classifier still draws the classification pictures."""

import math
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torchmetrics.classification import MulticlassConfusionMatrix, MulticlassJaccardIndex

from src import api
from src.callbacks.pictures import to_rgb
from src.callbacks.segmentation_pictures import (
    IGNORED,
    TINT,
    class_iou,
    draw_iou,
    draw_segmentations,
    overlay,
)
from src.common.display import class_palette
from src.run.builder import instantiate_group, skip_idle_batch_hooks
from tests.conftest import ONE_BATCH, SMALL_SCENES

TEST_PICTURES = ["test_iou_per_class.png", "test_segmentations.png"]
NOT_SEGMENTATION = (
    "SegmentationPictures fits segmentation models, not classification: it is left out of this run"
)
NOT_CLASSIFICATION = (
    "PredictionPictures fits classification models, not segmentation: it is left out of this run"
)


@pytest.mark.slow
def test_a_segmentation_training_sends_its_pictures_to_tensorboard_and_saves_the_test_ones(here: list[str]):
    run_dir = api.train([
        *here, "experiment=segment_digits", *SMALL_SCENES, *ONE_BATCH, "logger=tensorboard",
        "callbacks=[default,segmentation_pictures]",
    ]).run_dir  # fmt: skip
    assert "left out of this run" not in (run_dir / "train.log").read_text()
    assert sorted(p.name for p in (run_dir / "pictures").iterdir()) == TEST_PICTURES
    segmentations = Image.open(run_dir / "pictures" / "test_segmentations.png")
    assert segmentations.size[1] > 8 * 150  # num_samples=8 rows of input | ground truth | prediction
    (events_dir,) = {p.parent for p in (run_dir / "tensorboard").glob("**/events.out.tfevents.*")}
    events = EventAccumulator(str(events_dir), size_guidance={"images": 0})
    events.Reload()
    stages = ("val", "test")  # validation too: an image logger is attached
    assert {f"{stage}/{tag}" for stage in stages for tag in ("iou_per_class", "segmentations")} <= set(
        events.Tags()["images"]
    )
    (logged,) = events.Images("test/segmentations")
    assert (logged.width, logged.height) == segmentations.size  # the PNG is what TensorBoard shows


def test_eval_of_a_segmentation_run_draws_its_test_pictures(segment_run: Path, here: list[str]):
    run = api.evaluate([*here, f"run_dir={segment_run}"])
    assert sorted(p.name for p in (run.run_dir / "pictures").iterdir()) == TEST_PICTURES
    assert (run.run_dir / "eval.log").read_text().count(NOT_CLASSIFICATION) == 1


def test_eval_of_a_classifier_draws_the_classification_pictures_with_one_line_more(
    digits_run: Path, here: list[str]
):
    run = api.evaluate([*here, f"run_dir={digits_run}"])
    pictures = run.run_dir / "pictures"
    assert sorted(p.name for p in pictures.iterdir()) == ["test_confusion_matrix.png", "test_predictions.png"]
    output = (run.run_dir / "eval.log").read_text()
    # The segmentation pictures eval composes are left out before they are made: one line, not two.
    assert output.count(NOT_SEGMENTATION) == 1 and "callbacks.segmentation_pictures" not in output


def test_the_iou_bars_are_each_class_iou_over_the_labelled_pixels():
    num_classes, ignore_index = 4, 255
    targets = torch.tensor([[0, 0, 1, 1, 2, 255], [0, 1, 1, 2, 2, 255]])
    preds = torch.tensor([[0, 1, 1, 1, 2, 3], [0, 1, 0, 2, 2, 3]])  # class 3 only where nothing is labelled
    confusion = MulticlassConfusionMatrix(num_classes, ignore_index=ignore_index)  # as the callback makes it
    iou = class_iou(confusion(preds, targets))
    # Counted by hand over the 10 labelled pixels: class 0 has 3 pixels and 3 predictions, 2 of them right.
    expected = torch.tensor([2 / 4, 3 / 5, 3 / 3, math.nan], dtype=torch.float64)
    assert torch.allclose(iou, expected, equal_nan=True)  # class 3: in neither targets nor counted preds
    jaccard = MulticlassJaccardIndex(num_classes, average=None, ignore_index=ignore_index)(preds, targets)
    assert torch.allclose(iou[:3].float(), jaccard[:3])  # what the module logs as test/iou_<class>
    figure = draw_iou(iou, ["background", "a", "b", "c"])
    (axes,) = figure.axes
    assert [bar.get_height() for bar in axes.patches] == pytest.approx([2 / 4, 3 / 5, 1, 0])
    assert [text.get_text() for text in axes.texts] == ["0.50", "0.60", "1.00", "absent"]
    miou = MulticlassJaccardIndex(num_classes, ignore_index=ignore_index)(preds, targets)  # val|test/miou
    assert axes.get_title().endswith(f"{miou:.3f})")


def test_debug_presets_draw_no_segmentation_pictures_and_eval_composes_both_tasks_pictures(compose_cfg):
    pictures = "callbacks=[default,segmentation_pictures]"
    assert compose_cfg("train", [pictures]).callbacks.segmentation_pictures is not None
    assert compose_cfg("train", [pictures, "debug=fdr"]).callbacks.segmentation_pictures is None
    assert {"prediction_pictures", "segmentation_pictures"} <= set(compose_cfg("eval").callbacks)


def test_a_segmentation_row_shows_the_image_and_each_mask_over_it_at_its_own_size():
    names, ignore_index = ["background", "1", "2"], 255
    image = torch.linspace(0, 1, 40 * 56).reshape(1, 40, 56)  # not square: a swapped axis would show
    target = torch.zeros(40, 56, dtype=torch.long)
    target[10:20, 10:30], target[:, :5] = 2, ignore_index
    pred = torch.ones(40, 56, dtype=torch.long)
    palette = class_palette(len(names))
    tinted = overlay(image, target, palette, ignore_index)
    grey = image[0].numpy()[..., None]
    assert tinted.shape == (40, 56, 3)
    assert np.allclose(tinted[15, 15], (1 - TINT) * grey[15, 15] + TINT * palette[2])
    assert np.allclose(tinted[15, 40], (1 - TINT) * grey[15, 40] + TINT * palette[0])
    assert np.allclose(tinted[:, :5], (1 - TINT) * grey[:, :5] + TINT * IGNORED)  # ignored: grey, no class
    assert not any(np.allclose(colour, IGNORED) for colour in class_palette(18))  # no class is grey

    def picture(rows: int) -> np.ndarray:
        figure = draw_segmentations([(image, pred, target)] * rows, names, ignore_index)
        assert [axes.images[0].get_array().shape for axes in figure.axes] == [(40, 56, 3)] * (3 * rows)
        legend = [text.get_text() for text in figure.legends[0].get_texts()]
        assert legend == [*names, "ignored (255)"]
        return to_rgb(figure)

    two, three = picture(2), picture(3)
    assert two.shape[1] == three.shape[1] == 540 and three.shape[0] - two.shape[0] == 180  # 100 dpi
    assert two.dtype == np.uint8 and two.shape[2] == 3


def test_without_an_image_logger_validation_skips_the_pictures_batch_hook(compose_cfg, tmp_path: Path):
    cfg = compose_cfg("train", ["callbacks=[default,segmentation_pictures]"])
    for logger, idle in ((CSVLogger(tmp_path), True), (TensorBoardLogger(tmp_path), False)):
        (callback,) = instantiate_group({"pictures": cfg.callbacks.segmentation_pictures}, "callbacks")
        trainer = L.Trainer(callbacks=[callback], logger=logger, accelerator="cpu", default_root_dir=tmp_path)
        skip_idle_batch_hooks(trainer)
        assert (callback.on_validation_batch_end is None) == idle
        assert callable(callback.on_test_batch_end)  # the test pictures are saved as PNGs all the same
