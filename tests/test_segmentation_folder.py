"""data=segmentation_folder: your own images and masks, every file checked before training, the check cached."""

import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from PIL import Image

from src import api
from src.data.segmentation_folder_datamodule import SegmentationFolderDataset
from tests.conftest import last_metrics, only_run_dir, paths
from tests.test_folds import datamodule

SIZES = [(24, 24), (32, 28), (40, 36), (28, 40)]  # (width, height): mixed on purpose
CLASSES = 3
TINY_UNET = ["model=segmenter", "model.net.channels=[4,8]"]


def write_pair(root: Path, index: int, size: tuple[int, int]) -> tuple[Path, Path]:
    """`root/images/img_<i>.png|jpg` and its mask `root/masks/img_<i>.png`: three classes in vertical bands
    (the image's grey level follows them) and a few unlabelled pixels (255)."""
    width, height = size
    mask = np.broadcast_to(np.arange(width) * CLASSES // width, (height, width)).astype(np.uint8)
    mask[0, :3] = 255
    grey = (mask.astype(np.int64) * 100 + np.random.default_rng(index).integers(0, 20, mask.shape)).clip(
        0, 255
    )
    image_path = root / "images" / f"img_{index}.{'jpg' if index % 2 else 'png'}"
    mask_path = root / "masks" / f"img_{index}.png"
    image_path.parent.mkdir(parents=True, exist_ok=True)
    mask_path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grey.astype(np.uint8)).convert("L" if index % 4 == 3 else "RGB").save(image_path)
    saved = Image.fromarray(mask)
    (saved.convert("P") if index % 5 == 4 else saved).save(mask_path)  # palette PNGs hold indices too
    return image_path, mask_path


def write_folder(root: Path, count: int = 12) -> list[tuple[Path, Path]]:
    return [write_pair(root, i, SIZES[i % len(SIZES)]) for i in range(count)]


def folder_overrides(root: Path) -> list[str]:
    return [
        "data=segmentation_folder",
        f"data.image_dir={root / 'images'}",
        f"data.mask_dir={root / 'masks'}",
        f"data.num_classes={CLASSES}",
        "data.input_shape=[3,32,32]",
        "data.split=[8,2,2]",
        "data.batch_size=4",
    ]


def write_test_data(data_dir: Path) -> list[str]:
    """data=segmentation_folder for tests that run every data option (tests/test_data.py): 12 small pairs at
    the default image_dir and mask_dir, and the overrides that describe them."""
    write_folder(data_dir / "segmentation")
    return [f"data.num_classes={CLASSES}", "data.input_shape=[3,32,32]"]


@pytest.fixture
def segmentation_folder(compose_cfg, tmp_path: Path):
    """Build the datamodule from configs/data/segmentation_folder.yaml with overrides, as the builder does."""

    def _build(*overrides: str, setup: bool = True):
        cfg = compose_cfg("train", [*folder_overrides(tmp_path), *overrides])
        datamodule = instantiate(cfg.data, _convert_="all")
        if setup:
            datamodule.setup("fit")
        return datamodule

    return _build


@pytest.mark.slow
def test_a_folder_of_images_and_masks_trains_tests_and_evaluates(tmp_path: Path):
    write_folder(tmp_path / "data")
    # The README's command (data=segmentation_folder model=segmenter monitor=val/miou ...), on 12 small pairs.
    readme = ["monitor=val/miou", "data.class_names=[background,road,car]"]
    overrides = [*folder_overrides(tmp_path / "data"), *TINY_UNET, *readme, "trainer.max_epochs=1"]
    where = paths(tmp_path / "logs", tmp_path / "data")
    run_dir = api.train([*where, *overrides, "run_name=seg"]).run_dir
    assert "Checked 12 of 12 image/mask pairs of segmentation folder" in (run_dir / "train.log").read_text()
    metrics = last_metrics(run_dir)
    assert {"test/miou", "test/dice", "test/iou_background", "test/iou_car", "val/miou_best"} <= set(metrics)
    checkpoint = torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["class_names"] == ["background", "road", "car"]
    assert "val/miou" in str(checkpoint["callbacks"])  # the best checkpoint is chosen by val/miou
    assert checkpoint["hyper_parameters"]["preprocessing"]["input_shape"] == [3, 32, 32]  # [part: predict]

    evaluated = api.evaluate([*where, f"run_dir={run_dir}"]).run_dir
    assert "Checked 0 of 12 image/mask pairs" in (evaluated / "eval.log").read_text()  # all from the cache
    evaluated_miou = last_metrics(evaluated)["test/miou"]
    assert math.isclose(evaluated_miou, metrics["test/miou"], rel_tol=1e-5)


def test_the_transforms_move_image_and_mask_together_and_keep_the_mask_values(segmentation_folder, tmp_path):
    # Bands of grey 0, 80, 160, 240 for classes 0, 1, 2 and the ignored 255, of unequal widths: a crop or
    # flip of the image that the mask did not get would show.
    bands = np.repeat(np.array([0, 0, 1, 2, 2, 2, 255, 255], np.uint8), 6)[None, :].repeat(40, axis=0)
    grey = np.select([bands == c for c in (0, 1, 2, 255)], [0, 80, 160, 240]).astype(np.uint8)
    for folder, pixels in (("images", grey), ("masks", bands)):
        (tmp_path / folder).mkdir()
        for i in range(3):
            Image.fromarray(pixels).save(tmp_path / folder / f"img_{i}.png")
    datamodule = segmentation_folder(
        "data.image_mode=L", "data.mean=[0.0]", "data.std=[1.0]", "data.input_shape=[1,32,32]",
        "data.split=[1,1,1]",
    )  # fmt: skip
    levels = torch.tensor([0.0, 80.0, 160.0, 240.0]) / 255
    as_class = torch.tensor([0, 1, 2, 255], dtype=torch.uint8)
    flipped = 0
    for seed in range(20):
        torch.manual_seed(seed)
        image, mask = datamodule.data_train[0]  # RandomResizedCrop, RandomHorizontalFlip
        assert image.shape == (1, 32, 32) and image.dtype == torch.float32
        assert mask.shape == (32, 32) and mask.dtype == torch.uint8
        assert set(mask.unique().tolist()) <= {0, 1, 2, 255}  # nearest neighbour: no blended values
        seen = as_class[(image[0, :, :, None] - levels).abs().argmin(dim=-1)]
        assert (seen == mask).float().mean() > 0.85  # the same classes, but for the blurred band edges
        flipped += int(mask[0, -1] == 0)  # the class-0 band on the right: flipped
    assert 0 < flipped < 20  # some flipped, some not, image and mask alike
    _, mask = datamodule.data_val[0]  # resized only: the bands squeezed from 48 to 32 columns
    columns = torch.arange(32) * 48 // 32
    assert torch.equal(mask, torch.from_numpy(bands[:32, columns.numpy()]))


# part: predict
def test_the_inference_transform_reads_an_image_file_alone(segmentation_folder, tmp_path: Path):
    write_folder(tmp_path, count=6)
    datamodule = segmentation_folder("data.split=[4,1,1]")
    preprocessing = datamodule.inference_preprocessing()
    assert preprocessing["image_mode"] == "RGB" and preprocessing.get("collate") is None  # PyTorch's
    image = Image.open(tmp_path / "images" / "img_2.png").convert(preprocessing["image_mode"])
    tensor = instantiate(preprocessing["transform"])(image)
    assert tuple(tensor.shape) == (3, 32, 32) and tensor.dtype == torch.float32
    assert torch.equal(tensor, datamodule.data_test.transform(image))


# /part


def test_a_mask_folder_inside_the_image_folder_holds_no_images(segmentation_folder, tmp_path: Path):
    for image, _ in write_folder(tmp_path, count=6):
        image.rename(tmp_path / image.name)  # <root>/img_<i>.png|jpg and <root>/masks/img_<i>.png
    datamodule = segmentation_folder(f"data.image_dir={tmp_path}", "data.split=[4,1,1]")
    assert datamodule.pairs() == [
        (tmp_path / f"img_{i}.{'jpg' if i % 2 else 'png'}", tmp_path / "masks" / f"img_{i}.png")
        for i in range(6)
    ]


def test_the_check_is_cached_and_a_changed_file_is_checked_again(
    segmentation_folder, tmp_path: Path, data_dir: Path, caplog
):
    pairs = write_folder(tmp_path)
    with caplog.at_level(logging.INFO):
        segmentation_folder()
        segmentation_folder()
    checked = [line for line in caplog.messages if line.startswith("Checked ")]
    assert checked[0].startswith("Checked 12 of 12 image/mask pairs of segmentation folder (0 skipped")
    assert checked[1].startswith("Checked 0 of 12 image/mask pairs of segmentation folder (12 skipped")
    bad_value(pairs[5][1])  # rewritten: a new modification time, whatever its size
    caplog.clear()
    for _ in range(2):  # a failure is never cached: it fails again
        with (
            caplog.at_level(logging.INFO),
            pytest.raises(RuntimeError, match=re.escape(f"{pairs[5][1]} has")),
        ):
            segmentation_folder()
    checked = [line for line in caplog.messages if line.startswith("Checked ")]
    assert [line[:16] for line in checked] == ["Checked 1 of 12 "] * 2
    (cache,) = [  # the JSON of this folder's check, among those of other tests
        file for file in (data_dir / "file_checks").glob("segmentation_folder_*.json")
        if str(tmp_path / "images") in file.read_text()
    ]  # fmt: skip
    passed = json.loads(cache.read_text())["passed"]
    assert len(passed) == 11 and not any(str(pairs[5][1]) in key for key in passed)


def test_the_check_cache_can_be_turned_off(segmentation_folder, tmp_path: Path, caplog):
    write_folder(tmp_path, count=6)
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            segmentation_folder("data.split=[4,1,1]", "data.check_cache=null")
    checked = [line for line in caplog.messages if line.startswith("Checked ")]
    assert checked == ["Checked 6 of 6 image/mask pairs of segmentation folder (no cache)"] * 2


def unlink(path: Path) -> None:
    path.unlink()


def resize(path: Path) -> None:
    Image.open(path).resize((10, 10)).save(path)


def bad_value(path: Path) -> None:
    values = np.asarray(Image.open(path)).copy()
    values[2, 2] = 7
    Image.fromarray(values).save(path)


def colour(path: Path) -> None:
    Image.open(path).convert("RGB").save(path)


def text(path: Path) -> None:
    path.write_text("not an image\n")


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:60])


# (what is done to which file of pair 6, whose image is img_6.png, 40x36, and the one line that must name it)
BAD_FILES = {
    "image without mask": ("mask", unlink, "image {image} has no mask: expected {mask} (a PNG of class indices"),
    "mask of another size": ("mask", resize, "mask {mask} is 10x10 pixels but its image {image} is 40x36;"),
    "bad mask value": (
        "mask", bad_value, "{mask} has mask value(s) 7, which are neither a class (0..2, data.num_classes=3) "
        "nor data.ignore_index=255",
    ),
    "RGB mask": ("mask", colour, "mask {mask} has 3 channel(s) (PIL mode RGB); a mask holds one class index"),
    "unreadable image": ("image", text, "cannot read image {image} (cannot identify image file"),
    "unreadable mask": ("mask", truncate, "cannot read mask {mask} ("),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_fails_the_run_before_training_in_one_line_naming_it(case: str, tmp_path: Path):
    image, mask = write_folder(tmp_path / "data")[6]
    which, spoil, message = BAD_FILES[case]
    spoil(mask if which == "mask" else image)
    overrides = [*folder_overrides(tmp_path / "data"), *TINY_UNET, "trainer.max_epochs=1"]
    with pytest.raises(RuntimeError, match=re.escape(message.format(image=image, mask=mask))) as failed:
        api.train([*paths(tmp_path / "logs", tmp_path / "data"), *overrides])
    assert "\n" not in str(failed.value)
    assert not (only_run_dir(tmp_path / "logs") / "checkpoints").exists()  # nothing was trained or saved


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (
            ["data.mask_dir=/nowhere"],
            r"data.mask_dir=/nowhere does not exist; give the folder of their masks",
        ),
        (["data.split=[0.8,0.2]"], r"data.split=\[0.8, 0.2\] needs 3 entries"),
        (
            ["+data.transforms.predict=null"],
            r"data.transforms has \['predict'\]; its keys are train, val, test",
        ),
        (["data.ignore_index=1"], r"data.ignore_index=1 is one of the 3 classes"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(segmentation_folder, tmp_path: Path, overrides, error):
    write_folder(tmp_path, count=3)
    with pytest.raises((InstantiationException, FileNotFoundError), match=error):
        segmentation_folder("data.split=[1,1,1]", *overrides)


def test_the_validation_fold_of_image_files_gets_the_validation_transforms(compose_cfg, tmp_path: Path):
    """Files with transforms per stage (data=segmentation_folder): the training folds go through the training
    (random) transforms, the validation fold through the validation ones."""
    write_folder(tmp_path)  # 12 image/mask pairs, split 8/2/2
    settings = folder_overrides(tmp_path)
    plain = datamodule(compose_cfg, *settings)
    dm = datamodule(compose_cfg, *settings, "data.num_folds=5", "data.fold=4")
    assert (len(dm.data_train), len(dm.data_val), len(dm.data_test)) == (8, 2, 2)
    torch.manual_seed(0)
    pair = dm.data_val.dataset.pairs[dm.data_val.indices[0]]
    image, mask = SegmentationFolderDataset([pair], plain.data_val.transform, "RGB")[0]
    assert torch.equal(dm.data_val[0][0], image) and torch.equal(dm.data_val[0][1], mask)  # resized only
    assert not torch.equal(dm.data_train[0][0], dm.data_train[0][0])  # training: random crops and flips
    assert dm.data_test.pairs == plain.data_test.pairs
