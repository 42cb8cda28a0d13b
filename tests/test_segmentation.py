"""The segmentation task end to end, as the README's "How to add a task" walks it: digit scenes built from the
shipped digits, the U-Net segmenter, its metrics, and what is refused with a clear message."""

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from src import api
from src.data.digit_scenes_datamodule import CLASS_NAMES, DigitScenesDataModule, build_scenes
from src.models.components.torchvision_segmentation import TorchvisionSegmentation  # [part: pretrained]
from src.models.components.unet import UNet
from src.models.segmenter_module import SegmenterModule
from tests import conftest  # [part: diagnostics]
from tests.conftest import SMALL_SCENES, last_metrics


def scenes_module(data_dir: Path, **settings) -> DigitScenesDataModule:
    return DigitScenesDataModule(str(data_dir), scenes=[40, 10, 10], **settings)


def test_digit_scenes_are_built_once_and_the_same_every_time(data_dir: Path, tmp_path: Path):
    datamodule = scenes_module(data_dir)
    datamodule.prepare_data()
    built = datamodule.cache_file.stat().st_mtime_ns
    train, _, test = datamodule.load_datasets()
    images, masks = train.tensors
    assert images.shape == (40, 1, 64, 64) and masks.shape == (40, 64, 64) and len(test) == 10
    assert set(torch.unique(masks).tolist()) <= set(range(11)) and masks.dtype == torch.uint8
    assert all(int((mask > 0).sum()) > 0 for mask in masks)  # every scene has a digit
    scenes_module(data_dir).prepare_data()
    assert datamodule.cache_file.stat().st_mtime_ns == built  # cached: not built again
    other = scenes_module(data_dir, digit_size=[24, 30])
    assert other.cache_file != datamodule.cache_file  # other settings, other scenes; the first ones stay
    again = scenes_module(tmp_path)  # built anew elsewhere from the same digits: the same scenes
    assert torch.equal(again.load_datasets()[0].tensors[1], masks)


def test_a_scene_labels_each_digit_pixel_with_its_class_and_the_rest_background():
    digit = np.zeros((1, 28, 28), np.uint8)
    digit[0, 4:24, 12:16] = 255  # a bar: a "1"
    scenes, masks = build_scenes(digit, np.array([1]), 3, 64, [1, 1], [28, 28], seed=0)
    for scene, mask in zip(scenes, masks, strict=True):
        assert set(np.unique(mask)) == {0, 2}  # background, and class 2: the digit 1
        assert np.array_equal(mask == 2, scene >= 128)  # the bright pixels, and only those
    assert CLASS_NAMES[2] == "1"


def test_test_scenes_hold_only_digits_of_the_test_pool(data_dir: Path):
    # The digit pools are the same split as data=mnist5k: every digit in a test scene is a test digit.
    datamodule = scenes_module(data_dir)
    pools = datamodule.digit_pools()
    assert not set(pools["train"]) & set(pools["test"]) and not set(pools["val"]) & set(pools["test"])
    assert sum(map(len, pools.values())) == 5000


def test_the_unet_keeps_any_image_size():
    net = UNet(input_shape=[3, 64, 64], num_classes=5, channels=[8, 16, 32])
    for size in ((64, 64), (37, 50), (9, 9)):
        assert net(torch.zeros(2, 3, *size)).shape == (2, 5, *size)


def test_the_segmenter_trains_logs_its_metrics_and_eval_reproduces_them(segment_run: Path, here: list[str]):
    metrics = last_metrics(segment_run)
    for name in (
        "train/loss",
        "train/acc",
        "val/miou",
        "val/dice",
        "val/miou_best",
        "test/miou",
        "test/dice",
        "test/acc",
    ):
        assert name in metrics, name
    per_class = [f"test/iou_{name}" for name in CLASS_NAMES]
    assert all(name in metrics for name in per_class)
    assert metrics["test/loss"] < math.log(11) + 1  # two epochs on 192 scenes: below an untrained net's loss
    assert math.isclose(metrics["test/miou"], np.mean([metrics[name] for name in per_class]), rel_tol=1e-4)
    evaluated = api.evaluate([*here, f"run_dir={segment_run}"])
    assert math.isclose(last_metrics(evaluated.run_dir)["test/miou"], metrics["test/miou"], rel_tol=1e-5)


def test_the_checkpoint_knows_the_class_names_and_how_to_read_an_image(segment_run: Path):
    checkpoint = torch.load(segment_run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    assert hparams["class_names"] == CLASS_NAMES and hparams["num_classes"] == 11
    # part: predict
    assert hparams["preprocessing"]["image_mode"] == "L" and hparams["preprocessing"]["input_shape"] == [
        1,
        64,
        64,
    ]
    # /part


def test_data_and_model_of_different_tasks_are_refused_before_training(here: list[str]):
    refusal = (
        "the data (DigitScenesDataModule) gives segmentation samples but the model (ClassifierModule) is a "
        "classification model; choose a model option for segmentation"
    )
    with pytest.raises(ValueError, match=re.escape(refusal)):
        api.train([*here, "data=digit_scenes", "model=classifier", *SMALL_SCENES])


# part: diagnostics
def test_a_classification_only_callback_is_left_out_of_a_segmentation_run_with_one_line(here: list[str]):
    run = api.train([
        *here, "experiment=segment_digits", *SMALL_SCENES, *conftest.ONE_BATCH,
        "callbacks=[default,prediction_pictures]",
    ])  # fmt: skip
    left_out = "PredictionPictures fits classification models, not segmentation: it is left out of this run"
    assert (run.run_dir / "train.log").read_text().count(left_out) == 1


# /part


def test_the_first_loss_check_expects_ln_num_classes_per_pixel_plus_the_dice_loss(here: list[str]):
    # Inputs scaled 1000 times too large: the untrained net's first loss is far from ln(11).
    rigged = [
        "experiment=segment_digits",
        *SMALL_SCENES,
        "debug=fdr",
        "data.std=0.0002",
        "model.net.batch_norm=false",
    ]
    run = api.train([*here, *rigged])
    expected = "far from ln(11) = 2.4 per pixel plus 1 x a Dice loss of about 1, what an untrained segmenter"
    assert expected in (run.run_dir / "debug.log").read_text()  # a debug preset's run is task_name=debug


def test_the_dice_loss_is_0_for_a_perfect_prediction_and_near_1_for_a_uniform_one():
    module = SegmenterModule(
        net={"_target_": "torch.nn.Identity"}, optimizer={}, num_classes=3, dice_weight=1.0
    )
    masks = torch.tensor([[[0, 1], [2, 255]]])
    perfect = torch.nn.functional.one_hot(masks.clamp(max=2), 3).permute(0, 3, 1, 2).float() * 100
    assert module.dice_loss(perfect, masks) < 0.01
    assert 0.3 < module.dice_loss(torch.zeros(1, 3, 2, 2), masks) < 0.7  # each class a third: Dice 0.5


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("ignore_index", 3, "data.ignore_index=3 is one of the 11 classes"),
        ("class_names", ["a", "b"], "data.class_names has 2 names but data.num_classes=11"),
        ("digit_size", [20, 80], "data.digit_size=[20, 80]: a digit must fit the 64x64 scene"),
        (
            "digits_per_scene",
            [3, 1],
            "data.digits_per_scene=[3, 1] must be [low, high] with 1 <= low <= high",
        ),
    ],
)
def test_bad_scene_settings_are_refused_naming_the_key(data_dir: Path, key: str, value, message: str):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        DigitScenesDataModule(str(data_dir), **{key: value})


def test_class_weights_must_give_one_weight_per_class():
    with pytest.raises(
        ValueError, match=r"model.class_weights=\[0.1, 1\] must give one weight >= 0 per class \(3\)"
    ):
        SegmenterModule(
            net={"_target_": "torch.nn.Identity"}, optimizer={}, num_classes=3, class_weights=[0.1, 1]
        )


def test_a_mask_value_that_is_neither_a_class_nor_ignored_is_named_with_its_file(data_dir: Path):
    datamodule = scenes_module(data_dir)
    datamodule.check_mask(torch.tensor([[0, 10], [255, 3]]), "a.png")  # classes and ignore_index pass
    with pytest.raises(
        ValueError, match=r"a.png has mask value\(s\) 11, 12, which are neither a class \(0..10"
    ):
        datamodule.check_mask(torch.tensor([[0, 11], [12, 255]]), "a.png")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda d: DigitScenesDataModule(str(d), num_classes=10),
            "data.num_classes=10 but digit scenes have 11",
        ),
        (lambda d: DigitScenesDataModule(str(d), num_classes=1), "data.num_classes=1 must be at least 2"),
        (
            lambda d: DigitScenesDataModule(str(d), input_shape=[1, 64, 32]),
            "data.input_shape=[1, 64, 32]: digit",
        ),
        (
            lambda d: DigitScenesDataModule(str(d), scenes=[10, 0, 5]),
            "data.scenes=[10, 0, 5] must give three",
        ),
        (
            lambda d: UNet(input_shape=[1, 8, 8], num_classes=3, channels=[8]),
            "model.net.channels=[8] needs at",
        ),
        (
            lambda d: SegmenterModule(net={}, optimizer={}, num_classes=3, dice_weight=-1),
            "model.dice_weight=-1 must be 0 (cross-entropy only) or more",
        ),
        # part: pretrained
        (
            lambda d: TorchvisionSegmentation("resnet18", [3, 32, 32], 3),
            "model.net.name=resnet18 is not a torchvision segmentation model; choose one of",
        ),
        (
            lambda d: TorchvisionSegmentation("lraspp_mobilenet_v3_large", [4, 32, 32], 3),
            "model/net=lraspp_mobilenet_v3_large takes 1 or 3 input channels, not data.input_shape[0]=4",
        ),
        # /part
    ],
)
def test_bad_settings_of_the_segmentation_parts_are_refused_naming_the_key(
    data_dir: Path, build, message: str
):
    with pytest.raises(ValueError, match=re.escape(message)):
        build(data_dir)
