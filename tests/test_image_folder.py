"""data=image_folder: your own image files with a label file or class folders, checked before training."""

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm  # [part: pretrained]
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from PIL import Image

from src import api
from src.data.components.collate import pad_collate
from src.data.components.example_images import CLASS_NAMES, make_example_images
from src.data.components.mnist5k_file import load_mnist5k
from src.data.components.preprocessing import follow_the_weights
from tests.conftest import ROOT, last_metrics, only_run_dir, paths
from tests.helpers import StopAt

SIZES = [(20, 24), (32, 32), (40, 28)]  # (width, height): mixed on purpose


def write_image(path: Path, size: tuple[int, int] = (32, 32), mode: str = "RGB", seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).convert(mode).save(path)
    return path


def write_label_folder(
    root: Path, labels: list[str], header: str | None = "image,label", start: int = 0
) -> Path:
    """`root/img_<i>.png|jpg` of mixed sizes, modes and formats, and `root/labels.csv` (returned)."""
    lines = [header] if header else []
    for i, label in enumerate(labels, start=start):
        name = f"img_{i}.{'jpg' if i % 2 else 'png'}"
        write_image(root / name, SIZES[i % 3], mode="L" if i % 4 == 3 else "RGB", seed=i)
        lines.append(f"{name},{label}")
    csv_file = root / f"labels_{start}.csv"
    csv_file.write_text("\n".join(lines) + "\n")
    return csv_file


def write_test_data(data_dir: Path) -> list[str]:
    """data=image_folder for tests that run every data option (tests/test_data.py): 24 small images of two
    classes at the default image_dir, and the overrides that describe them."""
    labels = write_label_folder(data_dir / "images", ["cat", "dog"] * 12)
    return [f"data.label_file={labels}", "data.num_classes=2", "data.input_shape=[3,16,16]"]


@pytest.fixture
def image_folder(compose_cfg, tmp_path: Path):
    """Build the datamodule from configs/data/image_folder.yaml with overrides, as the builder does."""

    def _build(*overrides: str, setup: bool = True):
        cfg = compose_cfg("train", ["data=image_folder", f"data.image_dir={tmp_path}", *overrides])
        follow_the_weights(cfg)
        datamodule = instantiate(cfg.data, _convert_="all")
        if setup:
            datamodule.setup("fit")
        return datamodule

    return _build


def labels_of(dataset) -> list[int]:
    return [label for _, label in dataset.samples]


# --- reading labels and splitting ---


def test_a_label_file_with_class_names_is_split_by_fractions(image_folder, tmp_path: Path):
    names = ["cat", "dog", "emu", "fox"] * 5
    labels = write_label_folder(tmp_path, names)
    dm = image_folder(f"data.label_file={labels}", "data.num_classes=4", "data.split=[0.6,0.2,0.2]")
    assert (len(dm.data_train), len(dm.data_val), len(dm.data_test)) == (12, 4, 4)
    assert dm.hparams.class_names == ["cat", "dog", "emu", "fox"]  # sorted names -> 0..3
    everything = dm.data_train.samples + dm.data_val.samples + dm.data_test.samples
    assert sorted(label for _, label in everything) == sorted([0, 1, 2, 3] * 5)
    for path, label in everything:  # every image keeps its own label
        line = next(line for line in labels.read_text().splitlines() if line.startswith(path.name + ","))
        assert ["cat", "dog", "emu", "fox"][label] == line.split(",")[1]
    again = image_folder(f"data.label_file={labels}", "data.num_classes=4", "data.split=[0.6,0.2,0.2]")
    assert again.data_test.samples == dm.data_test.samples  # the same split every time


def test_the_split_is_stratified_by_class_and_the_same_on_every_run(image_folder, tmp_path: Path):
    """A few images of a rare class: the val and test splits each still get their share of every class."""
    labels = write_label_folder(tmp_path, ["cat"] * 24 + ["dog"] * 8 + ["emu"] * 4)
    common = [f"data.label_file={labels}", "data.num_classes=3", "data.split=[0.5,0.25,0.25]"]
    dm = image_folder(*common)
    counts = {
        split: [labels_of(dataset).count(label) for label in range(3)]
        for split, dataset in (("train", dm.data_train), ("val", dm.data_val), ("test", dm.data_test))
    }
    assert counts == {"train": [12, 4, 2], "val": [6, 2, 1], "test": [6, 2, 1]}  # 24, 8, 4 in 2:1:1
    again = image_folder(*common)
    assert (again.data_val.samples, again.data_test.samples) == (dm.data_val.samples, dm.data_test.samples)


def test_headerless_integer_labels_and_separate_val_and_test_files(image_folder, tmp_path: Path):
    train = write_label_folder(tmp_path, ["0", "1", "2"] * 4, header=None)
    val = write_label_folder(tmp_path, ["2", "1"], header=None, start=100)
    test = write_label_folder(tmp_path, ["0", "0", "2"], header=None, start=200)
    dm = image_folder(
        f"data.label_file={train}",
        f"data.val_label_file={val}",
        f"data.test_label_file={test}",
        "data.num_classes=3",
        "data.split=[1.0,0.0,0.0]",
    )
    assert (len(dm.data_train), len(dm.data_val), len(dm.data_test)) == (12, 2, 3)
    assert labels_of(dm.data_val) == [2, 1] and labels_of(dm.data_test) == [0, 0, 2]
    assert dm.hparams.class_names == ["0", "1", "2"]


def test_columns_by_header_name_and_class_names_in_config_order(image_folder, tmp_path: Path):
    lines = ["label,notes,file"]
    for i, label in enumerate(["dog", "cat", "dog", "cat", "dog"]):
        write_image(tmp_path / f"{i}.png", seed=i)
        lines.append(f"{label},anything,{i}.png")
    (tmp_path / "meta.csv").write_text("\n".join(lines) + "\n")
    dm = image_folder(
        f"data.label_file={tmp_path / 'meta.csv'}",
        "data.image_column=file",
        "data.label_column=label",
        "data.num_classes=2",
        "data.class_names=[dog,cat]",
        "data.split=[3,1,1]",
    )
    assert dm.hparams.class_names == ["dog", "cat"]
    everything = dm.data_train.samples + dm.data_val.samples + dm.data_test.samples
    assert {(p.name, label) for p, label in everything} == {
        ("0.png", 0),
        ("1.png", 1),
        ("2.png", 0),
        ("3.png", 1),
        ("4.png", 0),
    }


def test_class_folders_with_their_own_val_and_test_folders(image_folder, tmp_path: Path):
    for split, count in (("train", 4), ("val", 1), ("test", 2)):
        for name in ("apple", "pear"):
            for i in range(count):
                write_image(tmp_path / split / name / "sub" / f"{i}.jpg", SIZES[i % 3], seed=i)
    (tmp_path / "train" / "notes.txt").write_text("not an image")
    dm = image_folder(
        "data.layout=class_folders",
        "data.label_file=null",
        f"data.image_dir={tmp_path / 'train'}",
        f"data.val_dir={tmp_path / 'val'}",
        f"data.test_dir={tmp_path / 'test'}",
        "data.num_classes=2",
        "data.split=[1.0,0.0,0.0]",
    )
    assert (len(dm.data_train), len(dm.data_val), len(dm.data_test)) == (8, 2, 4)
    assert dm.hparams.class_names == ["apple", "pear"]
    assert sorted(labels_of(dm.data_test)) == [0, 0, 1, 1]


# --- transforms, batches and DataLoader settings ---


def test_the_config_transforms_give_input_shape_float_tensors(image_folder, tmp_path: Path):
    labels = write_label_folder(tmp_path, ["a", "b"] * 4)
    dm = image_folder(
        f"data.label_file={labels}", "data.num_classes=2", "data.input_shape=[3,16,16]", "data.split=[4,2,2]"
    )
    images, targets = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 16, 16) and images.dtype == torch.float32
    assert targets.dtype == torch.long
    assert images.mean().abs() < 3  # normalised, not 0..255
    val_images, _ = next(iter(dm.val_dataloader()))
    assert val_images.shape == (2, 3, 16, 16)
    grayscale = image_folder(
        f"data.label_file={labels}",
        "data.num_classes=2",
        "data.image_mode=L",
        "data.input_shape=[1,16,16]",
        "data.mean=[0.5]",
        "data.std=[0.25]",
        "data.split=[4,2,2]",
    )
    assert next(iter(grayscale.test_dataloader()))[0].shape == (2, 1, 16, 16)  # test uses val's transforms


def test_augment_false_gives_the_training_images_the_test_transforms(image_folder, tmp_path: Path):
    labels = write_label_folder(tmp_path, ["a", "b"] * 4)
    settings = [
        f"data.label_file={labels}",
        "data.num_classes=2",
        "data.input_shape=[3,16,16]",
        "data.split=[4,2,2]",
    ]
    torch.manual_seed(0)
    augmented = image_folder(*settings)
    assert not torch.equal(augmented.data_train[0][0], augmented.data_train[0][0])  # random crops and flips
    plain = image_folder(*settings, "data.augment=false")  # what debug=overfit sets
    image, again = plain.data_train[0][0], plain.data_train[0][0]
    assert torch.equal(image, again)
    test_transform = plain.data_test.transform
    assert torch.equal(image, test_transform(Image.open(plain.data_train.samples[0][0]).convert("RGB")))


def test_a_fold_validates_with_the_validation_transforms_and_holds_both_classes(image_folder, tmp_path: Path):
    """k-fold (tests/test_folds.py): the training folds get the training (random) transforms, the validation
    fold the validation ones, and the folds are stratified by the labels of the label file."""
    labels = write_label_folder(tmp_path, ["cat", "dog"] * 10)
    settings = [
        f"data.label_file={labels}",
        "data.num_classes=2",
        "data.input_shape=[3,16,16]",
        "data.split=[14,2,4]",
    ]
    plain = image_folder(*settings)
    fold = image_folder(*settings, "data.num_folds=4", "data.fold=3")
    assert (len(fold.data_train), len(fold.data_val)) == (12, 4)  # the 16 train+val images in 4 folds
    assert fold.data_test.samples == plain.data_test.samples
    pool = fold.data_val.dataset
    path, _ = pool.samples[fold.data_val.indices[0]]
    torch.manual_seed(0)
    assert torch.equal(fold.data_val[0][0], plain.data_val.transform(Image.open(path).convert("RGB")))
    assert not torch.equal(fold.data_train[0][0], fold.data_train[0][0])  # random crops and flips
    dogs = sum(pool.targets)
    assert abs(sum(pool.targets[i] for i in fold.data_val.indices) - dogs / 4) < 1  # the pool's share of dogs


def test_pad_collate_pads_to_the_largest_image_and_returns_the_sizes(image_folder, tmp_path: Path):
    batch = [(torch.ones(3, 24, 20), 0), (torch.ones(3, 32, 32), 1), (torch.ones(3, 28, 40), 2)]
    images, labels, sizes = pad_collate(batch)
    assert images.shape == (3, 3, 32, 40)
    assert sizes.tolist() == [[24, 20], [32, 32], [28, 40]] and labels.tolist() == [0, 1, 2]
    assert images[0, :, :24, :20].eq(1).all() and images[0, :, 24:, :].eq(0).all()  # padded with zeros

    labels_csv = write_label_folder(tmp_path, ["a", "b", "c"] * 3)
    dm = image_folder(
        f"data.label_file={labels_csv}",
        "data.num_classes=3",
        "data.collate=pad",
        "data.transforms.train=null",  # no resize: each image keeps its size
        "data.transforms.val=null",
        "data.split=[3,3,3]",
        "data.batch_size=3",
    )
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        images, labels, sizes = next(iter(loader))
        assert images.shape[:2] == (3, 3) and images.shape[2:] == tuple(sizes.max(dim=0).values.tolist())
        assert {tuple(size) for size in sizes.tolist()} <= {(h, w) for w, h in SIZES}  # the original sizes


def test_images_of_mixed_sizes_without_resize_or_pad_get_a_clear_error(image_folder, tmp_path: Path):
    labels_csv = write_label_folder(tmp_path, ["a", "b", "c"] * 3)
    overrides = [
        "data.num_classes=3",
        "data.transforms.train=null",
        "data.split=[3,3,3]",
        "data.batch_size=3",
    ]
    with pytest.raises(
        ValueError, match=r"data.input_shape=\[3, 64, 64\] but the transformed training images"
    ):
        image_folder(f"data.label_file={labels_csv}", *overrides)
    # The first training image's size (a "b" image, 32x32): the check passes, and a batch then mixes sizes.
    dm = image_folder(f"data.label_file={labels_csv}", *overrides, "data.input_shape=[3,32,32]", setup=False)
    dm.setup("fit")
    with pytest.raises(
        ValueError, match=r"a batch holds images of different shapes .* or set data.collate=pad"
    ):
        next(iter(dm.train_dataloader()))


def test_an_empty_split_is_refused(image_folder, tmp_path: Path):
    labels_csv = write_label_folder(tmp_path, ["a", "b"] * 2)
    with pytest.raises(ValueError, match=r"the test split of image folder is empty; check data.split"):
        image_folder(f"data.label_file={labels_csv}", "data.num_classes=2", "data.split=[0.5,0.5,0.0]")


def test_a_mixed_size_folder_trains_with_pad_collate_and_the_cnn(compose_cfg, tmp_path: Path):
    from src.run.builder import build

    labels = write_label_folder(tmp_path, ["a", "b", "c"] * 4)
    cfg = compose_cfg(
        "train",
        [
            "data=image_folder",
            f"data.image_dir={tmp_path}",
            f"data.label_file={labels}",
            "data.num_classes=3",
            "data.collate=pad",
            "data.transforms.train=null",
            "data.transforms.val=null",
            "data.batch_size=4",
            "debug=fdr",
            "extras.print_config=false",
        ],
    )
    with build(cfg) as run:
        run.trainer.fit(run.model, datamodule=run.datamodule)
        images, _, sizes = next(iter(run.datamodule.train_dataloader()))
    assert run.trainer.state.finished and "train/loss" in run.trainer.callback_metrics
    assert images.shape[-2:] == tuple(sizes.max(dim=0).values.tolist())


def test_dataloader_settings_are_safe_without_worker_processes(image_folder, tmp_path: Path):
    labels = write_label_folder(tmp_path, ["a", "b"] * 5)
    common = [f"data.label_file={labels}", "data.num_classes=2", "data.split=[6,2,2]", "data.batch_size=4"]
    dm = image_folder(*common, "data.num_workers=0", "data.persistent_workers=true", "data.prefetch_factor=4")
    loader = dm.train_dataloader()
    assert loader.num_workers == 0 and loader.prefetch_factor is None and not loader.persistent_workers
    assert len(list(loader)) == 2  # 6 images in batches of 4: the last one is kept
    dm = image_folder(
        *common,
        "data.num_workers=2",
        "data.persistent_workers=true",
        "data.prefetch_factor=4",
        "data.drop_last=true",
    )
    loader = dm.train_dataloader()
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 4, True)
    assert [len(y) for _, y in loader] == [4]  # the incomplete batch is dropped (training only)
    assert sum(len(y) for _, y in dm.val_dataloader()) == 2


# --- bad data, each caught with a message that says where ---


def test_a_line_that_does_not_parse_names_the_file_and_line(image_folder, tmp_path: Path):
    labels = write_label_folder(tmp_path, ["a", "b", "a"])
    labels.write_text(labels.read_text() + "img_9.png\n")
    with pytest.raises(ValueError, match=rf"{labels}, line 5: expected at least 2 comma-separated fields"):
        image_folder(f"data.label_file={labels}", "data.num_classes=2")


def test_a_missing_image_is_named_before_training(image_folder, tmp_path: Path):
    labels = write_label_folder(tmp_path, ["a", "b", "a", "b"])
    (tmp_path / "img_2.png").unlink()
    with pytest.raises(FileNotFoundError, match=rf"line 4: image {tmp_path / 'img_2.png'} does not exist"):
        image_folder(f"data.label_file={labels}", "data.num_classes=2", "data.split=[2,1,1]")


def test_a_corrupt_image_fails_with_its_name_or_is_skipped_and_counted(image_folder, tmp_path: Path, caplog):
    labels = write_label_folder(tmp_path, ["a", "b"] * 4)
    (tmp_path / "img_4.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    common = [f"data.label_file={labels}", "data.num_classes=2", "data.split=[6,1,1]", "data.batch_size=8"]

    def read_everything(dm) -> int:
        return sum(
            len(y)
            for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader())
            for _, y in loader
        )

    with pytest.raises(
        RuntimeError, match=rf"cannot read image {tmp_path / 'img_4.png'} .*data.skip_corrupt=true"
    ):
        read_everything(image_folder(*common))
    with caplog.at_level(logging.WARNING):  # checked once, before training; the split is drawn from the rest
        skipping = image_folder(
            *common[:2], "data.split=[5,1,1]", "data.batch_size=8", "data.skip_corrupt=true"
        )
    assert (
        f"Skipped 1 unreadable image(s) of 8 (data.skip_corrupt=true): {tmp_path / 'img_4.png'}"
        in caplog.text
    )
    assert read_everything(skipping) == 7


def test_an_unreadable_image_fails_the_run_before_training_in_one_line(tmp_path: Path, here: list[str]):
    labels = write_label_folder(tmp_path / "images", ["cat", "dog"] * 6)
    bad = tmp_path / "images" / "img_4.png"
    bad.write_text("not an image\n")  # a text file named .png
    expected = re.escape(f"cannot read image {bad} (cannot identify image file") + ".*data.skip_corrupt=true"
    with pytest.raises(RuntimeError, match=expected):  # `.` matches no line break: one line says both
        api.train([
            *here, "data=image_folder", f"data.image_dir={tmp_path / 'images'}", f"data.label_file={labels}",
            "data.num_classes=2", "data.input_shape=[3,16,16]", "model/net=mlp", "trainer.max_epochs=1",
        ])  # fmt: skip
    assert not (only_run_dir(tmp_path) / "checkpoints").exists()  # nothing was trained or saved


def test_a_named_run_stopped_mid_epoch_continues_with_the_same_command(tmp_path: Path, here: list[str]):
    """data.interpolation (and mean, std) left null follow the net: the same command, filled the same way
    before the resume check, is the same config (it was refused as another one)."""
    labels = write_label_folder(tmp_path / "images", ["cat", "dog"] * 8)
    command = [
        *here, "data=image_folder", f"data.image_dir={tmp_path / 'images'}", f"data.label_file={labels}",
        "data.num_classes=2", "data.input_shape=[3,16,16]", "data.batch_size=4", "model/net=mlp",
        "trainer.max_epochs=3", "run_name=folder", "+callbacks.stop._target_=tests.helpers.StopAt",
    ]  # fmt: skip
    StopAt.moment = (5, None)  # SIGTERM after step 5, in the second epoch
    with pytest.raises(SystemExit):
        api.train(command)
    run_dir = api.train(command).run_dir
    assert "Resuming run folder" in (run_dir / "train.log").read_text()


def test_the_image_check_is_cached_and_a_changed_image_is_checked_again(image_folder, tmp_path: Path, caplog):
    labels = write_label_folder(tmp_path, ["a", "b"] * 4)
    common = [f"data.label_file={labels}", "data.num_classes=2", "data.split=[6,1,1]"]
    with caplog.at_level(logging.INFO):
        image_folder(*common)
        image_folder(*common)
        (tmp_path / "img_4.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
        with pytest.raises(RuntimeError, match=re.escape(f"cannot read image {tmp_path / 'img_4.png'} (")):
            image_folder(*common)
        image_folder(*common[:2], "data.split=[5,1,1]", "data.skip_corrupt=true")  # the bad one left out
    checked = [line.split(" (")[0] for line in caplog.messages if line.startswith("Checked ")]
    assert checked == [
        "Checked 8 of 8 images of image folder",
        "Checked 0 of 8 images of image folder",  # unchanged: taken from data.check_cache
        "Checked 1 of 8 images of image folder",  # the changed one; a failure is never cached
        "Checked 1 of 8 images of image folder",
    ]


def test_an_unknown_class_in_the_test_labels_is_refused(image_folder, tmp_path: Path):
    train = write_label_folder(tmp_path, ["cat", "dog"] * 3)
    test = write_label_folder(tmp_path, ["cat", "cow"], start=50)
    with pytest.raises(
        ValueError, match=rf"{test}, line 3: unknown class 'cow' for img_51.jpg; the classes are cat, dog"
    ):
        image_folder(
            f"data.label_file={train}",
            f"data.test_label_file={test}",
            "data.num_classes=2",
            "data.split=[0.5,0.5,0.0]",
        )


@pytest.mark.parametrize("key", ["label_file", "val_label_file", "test_label_file"])
def test_a_missing_label_file_is_named_by_its_own_key(image_folder, tmp_path: Path, key: str):
    labels = write_label_folder(tmp_path, ["a", "b"] * 4)
    files = {"label_file": labels, "val_label_file": labels, "test_label_file": labels}
    files[key] = tmp_path / "missing.csv"
    with pytest.raises(
        FileNotFoundError,
        match=rf"^data\.{key}={re.escape(str(files[key]))} does not exist; .*a CSV with one `image,label` line",
    ):
        image_folder(
            *(f"data.{k}={v}" for k, v in files.items()), "data.num_classes=2", "data.split=[1.0,0.0,0.0]"
        )


@pytest.mark.parametrize("key", ["image_dir", "val_dir", "test_dir"])
def test_a_missing_class_folder_root_is_named_by_its_own_key(image_folder, tmp_path: Path, key: str):
    for name in ("apple", "pear"):
        write_image(tmp_path / "fruit" / name / "0.png")
    folders = {"image_dir": tmp_path / "fruit", "val_dir": tmp_path / "fruit", "test_dir": tmp_path / "fruit"}
    folders[key] = tmp_path / "missing"
    with pytest.raises(
        FileNotFoundError,
        match=rf"^data\.{key}={re.escape(str(folders[key]))} does not exist; .*one folder of",
    ):
        image_folder(
            "data.layout=class_folders",
            "data.label_file=null",
            *(f"data.{k}={v}" for k, v in folders.items()),
            "data.num_classes=2",
            "data.split=[1.0,0.0,0.0]",
        )


def test_the_example_experiment_pointed_at_your_own_files_names_the_key_still_to_change(
    compose_cfg, tmp_path: Path
):
    """Its comment once said image_dir and label_file were enough: the test file still pointed at the digits."""
    labels = write_label_folder(tmp_path, ["cat", "dog"] * 4)
    cfg = compose_cfg(
        "train",
        [
            "experiment=mnist_images",
            f"data.image_dir={tmp_path}",
            f"data.label_file={labels}",
            "data.class_names=null",
            "data.num_classes=2",
            "data.prepare=null",
        ],
    )
    cfg.paths.data_dir = str(tmp_path / "data")  # not the session's, where another test may have built them
    follow_the_weights(cfg)
    datamodule = instantiate(cfg.data, _convert_="all")
    with pytest.raises(
        FileNotFoundError, match=r"^data\.test_label_file=.*mnist_images/test\.csv does not exist"
    ):
        datamodule.setup("fit")


@pytest.mark.parametrize(
    ("content", "overrides", "error"),
    [
        ("", [], r"data.label_file=.*labels.csv is empty"),
        ("image,label\n", [], r"data.label_file=.*labels.csv lists no images"),
        (
            "image,label\nimg_0.png,cat\n",
            ["data.num_classes=3"],
            r"data.num_classes=3 but the training labels name 1 classes \(cat\)",
        ),
        ("image,label\nimg_0.png,7\n", ["data.num_classes=3"], r"line 2: unknown class '7'"),
        (
            "image,label\nimg_0.png,cat\n",
            ["data.image_column=path"],
            r"data.image_column=path is not a column of .*; its columns are image, label",
        ),
        (
            "img_0.png,cat\n",
            ["data.label_column=label"],
            r"data.label_column=label names a column, but .* has no header",
        ),
    ],
)
def test_bad_label_files_are_refused_with_what_is_wrong(
    image_folder, tmp_path: Path, content, overrides, error
):
    write_image(tmp_path / "img_0.png")
    (tmp_path / "labels.csv").write_text(content)
    with pytest.raises(ValueError, match=error):
        image_folder(f"data.label_file={tmp_path / 'labels.csv'}", "data.num_classes=1", *overrides)


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["data.layout=folders"], r"data.layout=folders is not valid; choose label_file or class_folders"),
        (["data.collate=ragged"], r"data.collate=ragged is not valid; choose stack or pad"),
        (["data.layout=class_folders"], r"data.label_file=.* does not apply to data.layout=class_folders"),
        (["data.val_dir=/somewhere"], r"data.val_dir=/somewhere does not apply to data.layout=label_file"),
        (["data.split=[0.8,0.2]"], r"data.split=\[0.8, 0.2\] needs 3 entries"),
        (
            ["+data.transforms.predict=null"],
            r"data.transforms has \['predict'\]; its keys are train, val, test",
        ),
    ],
)
def test_bad_settings_are_refused_when_the_datamodule_is_built(image_folder, overrides, error):
    with pytest.raises(InstantiationException, match=error):  # Hydra's wrapper around the ValueError
        image_folder(*overrides, setup=False)


def test_a_test_share_next_to_a_test_file_is_refused_so_no_image_is_dropped(image_folder, tmp_path: Path):
    train = write_label_folder(tmp_path, ["a", "b"] * 3)
    test = write_label_folder(tmp_path, ["a", "b"], start=50)
    with pytest.raises(ValueError, match=r"draws a test share .*e.g. data.split=\[0.8, 0.1, 0\]"):
        image_folder(f"data.label_file={train}", f"data.test_label_file={test}", "data.num_classes=2")


# --- end to end, as the README tells it ---


@pytest.mark.slow
def test_the_example_script_writes_a_label_file_folder_and_refuses_to_overwrite(
    tmp_path: Path, data_dir: Path
):
    out = tmp_path / "mnist_images"
    script = [sys.executable, str(ROOT / "scripts" / "make_example_images.py"), f"--out={out}"]
    result = subprocess.run(
        [*script, f"--data-dir={data_dir}", "--count=60", "--test=10"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(list((out / "images").glob("*.png"))) == 60
    train_lines = (out / "train.csv").read_text().splitlines()
    assert train_lines[0] == "image,label" and len(train_lines) == 51
    sizes = {Image.open(p).size for p in (out / "images").glob("*.png")}
    assert len(sizes) > 1 and all(28 <= w == h <= 40 for w, h in sizes)  # mixed sizes
    with pytest.raises(FileExistsError, match=rf"{re.escape(str(out))} already exists"):
        make_example_images(out, data_dir)  # what the script runs
    assert make_example_images(out, data_dir, exist_ok=True) == out  # what a first-use build does later

    folders = tmp_path / "class_folders"
    make_example_images(folders, data_dir, layout="class_folders", count=60, test=10)
    assert sorted(p.name for p in (folders / "train").iterdir()) == sorted(CLASS_NAMES)
    assert len(list((folders / "test").glob("*/*.png"))) == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["class_folders", "mnist_images"]  # no partial copy


@pytest.mark.slow
def test_the_image_folder_example_writes_its_images_on_first_use_and_trains_to_90_percent(
    tmp_path: Path, data_dir: Path
):
    data = tmp_path / "data"  # a data dir without the example folder, as on a fresh clone
    cache = Path("mnist5k") / "mnist_5k.npz"
    load_mnist5k(data_dir / cache)  # the parsed digits, which any earlier run would have cached
    shutil.copytree(data_dir / cache.parent, data / cache.parent)
    # One of the example's 3 epochs (93 % test accuracy; 97 % after 3): the folder's images reach the net as
    # the digits they are.
    where = paths(tmp_path / "logs", data)  # its own data dir, not the session's
    run_dir = api.train([*where, "experiment=mnist_images", "trainer.max_epochs=1"]).run_dir
    assert sorted(p.name for p in data.iterdir()) == ["mnist5k", "mnist_images"]  # nothing half-written left
    assert len(list((data / "mnist_images" / "images").glob("*.png"))) == 5000
    assert len((data / "mnist_images" / "test.csv").read_text().splitlines()) == 501  # a header and 500
    assert last_metrics(run_dir)["test/acc"] >= 0.90
    assert json.loads((run_dir / "class_names.json").read_text())[:3] == ["zero", "one", "two"]
    checkpoint = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=True)  # plain data only
    datamodule = checkpoint["datamodule_hyper_parameters"]
    assert datamodule["class_names"] == CLASS_NAMES
    assert datamodule["transforms"]["val"]["_target_"] == "torchvision.transforms.v2.Compose"  # preprocessing


# --- preprocessing that follows a pretrained net's weights (README, "Pretrained backbones") ---


def test_preprocessing_follows_the_weights_unless_the_data_config_sets_it(compose_cfg):
    # part: pretrained
    pretrained = [
        "data=image_folder",
        "model/net=timm",
        f"model.net.name={'test_resnet'}",
        "model.net.pretrained=true",
    ]
    cfg = compose_cfg("train", [*pretrained, "data.input_shape=null"])
    follow_the_weights(cfg)
    weights = timm.get_pretrained_cfg("test_resnet")
    assert cfg.data.input_shape == [3, 160, 160]  # the weights' size, with image_mode RGB's channels
    assert cfg.data.mean == list(weights.mean) and cfg.data.std == list(weights.std)
    assert cfg.data.interpolation == weights.interpolation
    resize = cfg.data.transforms.val.transforms[1]  # the data's transforms read the filled keys
    assert resize.interpolation == weights.interpolation and list(resize.size) == [160, 160]
    # part: predict
    # What checkpoints store for predict and export (TaskModule.setup asks the datamodule): the same.
    stored = instantiate(cfg.data, _convert_="all").inference_preprocessing()
    assert stored["input_shape"] == [3, 160, 160]
    normalize = next(
        step for step in stored["transform"]["transforms"] if step["_target_"].endswith("Normalize")
    )
    assert normalize["mean"] == list(weights.mean)
    # /part

    cfg = compose_cfg("train", [*pretrained, "data.mean=[0.5,0.5,0.5]", "data.interpolation=nearest"])
    follow_the_weights(cfg)
    assert cfg.data.mean == [0.5, 0.5, 0.5] and cfg.data.interpolation == "nearest"  # the data config wins
    assert cfg.data.std == list(weights.std) and cfg.data.input_shape == [3, 64, 64]
    # /part

    cfg = compose_cfg("train", ["data=image_folder", "data.image_mode=L", "data.input_shape=null"])
    with pytest.raises(
        ValueError,
        match=r"data.input_shape=null takes the size of the net's pretrained weights, but model/net=SimpleCNN has none; give the size, e.g. data.input_shape=\[1,64,64\]",
    ):
        follow_the_weights(cfg)
    cfg = compose_cfg("train", ["data=image_folder", "data.image_mode=L"])
    follow_the_weights(cfg)  # no weights: ImageNet's statistics, averaged over the colours for grayscale
    assert cfg.data.mean == [pytest.approx(0.449)] and cfg.data.interpolation == "bilinear"
