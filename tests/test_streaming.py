"""Shards of any data option (src/shard.py) and data=streaming: training from them is training from the option
itself, they are written once and never taken for finished when they are not, and a run from them resumes
exactly and splits its samples across DDP ranks."""

import hashlib
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate  # [part: folders]
from PIL import Image  # [part: predict, folders]

from src import api
from src.data.components.example_images import make_example_images  # [part: folders]
from src.data.components.shards import FACTS_FILE, PARTIAL_FILE, litdata
from src.data.streaming_datamodule import StreamingDataModule  # [part: folders]
from src.inference import export_formats  # [part: predict, folders]
from src.run.checkpoints import load_checkpoint
from src.run.trained_run import TrainedRun, load_model  # [part: predict, folders]
from tests import conftest  # [part: folders]
from tests import test_segmentation_folder as segmentation_folder  # [part: segmentation, folders]
from tests.conftest import ObjectStore, built_once, run_cli
from tests.test_object_store import as_user
from tests.test_resume import STEP_SAVES, assert_same_outcome, outcome


def shard(*overrides: str, output: Path | str, data_dir: Path) -> str:
    """`python src/shard.py overrides output_dir=<output>`, in this process as src.api runs a task; its log.
    (The command itself: the object storage test.)"""
    into = [
        f"output_dir={output}",
        "num_workers=2",
        f"paths.data_dir={data_dir}",
        "extras.print_config=false",
    ]
    logs = data_dir / "shard_logs"
    run = api.shard([*overrides, *into, f"paths.log_dir={logs}"])
    return (run.run_dir / "shard.log").read_text()


def facts(shards: Path) -> dict:
    return json.loads((shards / FACTS_FILE).read_text())


def stored(shards: Path, split: str) -> list:
    """Every sample of a split as the shards hold it (files' bytes, or tensors), in the shards' order."""
    return list(litdata().StreamingDataset(str(shards / split)))


def file_of(sample: dict) -> str:
    """The path of the file a stored sample came from."""
    return bytes(sample["file"]).decode()


def write_test_data(data_dir: Path) -> list[str]:
    """data=streaming for tests/test_data.py: the digits, sharded to the default input_dir."""
    shard("data=digits", output=data_dir / "shards", data_dir=data_dir)
    return []


@pytest.fixture(scope="session")
def digit_shards(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """`python src/shard.py data=digits`: in-memory tensors, stored as tensors."""
    build = lambda folder: shard("data=digits", output=folder / "shards", data_dir=data_dir)  # noqa: E731
    return built_once(tmp_path_factory, "digit_shards", build) / "shards"


# part: folders
def image_folder(images: Path) -> list[str]:
    """data=image_folder on the example digits (scripts/make_example_images.py): grey PNGs of mixed sizes."""
    files = [f"data.image_dir={images / 'images'}", f"data.label_file={images / 'train.csv'}"]
    files += [f"data.test_label_file={images / 'test.csv'}", "data.split=[0.8,0.2,0.0]"]
    grey = ["data.num_classes=10", "data.input_shape=[1,28,28]", "data.image_mode=L"]
    return ["data=image_folder", *files, *grey, "data.check_cache=null"]


@pytest.fixture(scope="session")
def image_shards(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """The example image folder (300 digits) and its shards (`shards/`): image files, stored as their bytes."""

    def build(folder: Path) -> None:
        make_example_images(folder / "images", data_dir, count=300, test=60)
        shard(*image_folder(folder / "images"), output=folder / "shards", data_dir=data_dir)

    return built_once(tmp_path_factory, "image_shards", build)


@pytest.fixture(scope="session")
def image_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, image_shards: Path) -> Path:
    """A short run trained from the image shards alone: `data=streaming data.input_dir=<shards>`."""

    def train(log_dir: Path) -> None:
        overrides = ["data=streaming", f"data.input_dir={image_shards / 'shards'}", "data.batch_size=32"]
        overrides += ["trainer.max_epochs=1", "+trainer.limit_train_batches=4", "run_name=images"]
        api.train([*conftest.paths(log_dir, data_dir), *overrides])

    return built_once(tmp_path_factory, "image_run", train) / "train" / "runs" / "images"


def decoded(shards: Path, split: str) -> dict[str, tuple[torch.Tensor, int]]:
    """Each sample of a split by its file, as data=streaming decodes it (with the source's transforms)."""
    streaming = StreamingDataModule(str(shards))
    streaming.setup("fit" if split == "val" else split)
    return {file_of(sample): streaming.decoders[split](sample) for sample in stored(shards, split)}


@pytest.mark.slow
def test_image_files_are_stored_as_their_bytes_and_read_back_as_the_source_reads_them(
    image_shards: Path, image_run: Path
):
    shards = image_shards / "shards"
    held = facts(shards)
    assert held["encoding"] == "files" and held["task"] == "classification" and held["num_classes"] == 10
    assert held["samples"] == {"train": 192, "val": 48, "test": 60}  # the source's own split of 240 + 60
    assert held["data"]["_target_"].endswith("ImageFolderDataModule") and held["input_shape"] == [1, 28, 28]
    sample = stored(shards, "test")[0]
    assert bytes(sample["image"]) == Path(file_of(sample)).read_bytes()  # the file itself, not pixels
    # The training samples are written shuffled (the label file lists them class by class, and litdata
    # shuffles only within chunks): the first 32 of the shards hold most classes.
    assert len({int(sample["label"]) for sample in stored(shards, "train")[:32]}) >= 6

    # The validation split read from the shards is the source's, sample for sample (its transforms are
    # deterministic): same files, same tensors.
    source = instantiate(held["data"], _convert_="all")
    source.setup("fit")
    expected = {str(path): source.data_val[i] for i, (path, _) in enumerate(source.data_val.samples)}
    samples = decoded(shards, "val")
    assert sorted(samples) == sorted(expected)
    for file, (image, label) in samples.items():
        assert torch.equal(image, expected[file][0]) and label == expected[file][1]

    # Trained from the shards alone: the classes and their names are the source's.
    record = json.loads((image_run / "run.json").read_text())
    assert record["status"] == "completed" and "test/acc" in record["final_metrics"]
    hparams = load_checkpoint(image_run / "checkpoints" / "best.ckpt")["hyper_parameters"]
    assert hparams["class_names"] == held["class_names"] == sorted(held["class_names"])
    owner = {"datamodule": "src.data.streaming_datamodule.StreamingDataModule"}  # [part: predict]
    assert hparams["preprocessing"] == owner | held["preprocessing"]  # the source's  [part: predict]


@pytest.mark.slow
def test_a_model_trained_from_shards_evaluates_on_the_source_images_as_on_the_shards(
    image_shards: Path, image_run: Path, here: list[str]
):
    source = image_folder(image_shards / "images")  # the option the shards came from, chosen again
    on_source = api.evaluate([*here, f"run_dir={image_run}", *source]).metrics
    on_shards = json.loads((image_run / "run.json").read_text())["final_metrics"]
    # (Not the loss: a mean of batch means, and the shards' batches hold the test images in another order.)
    assert on_source["test/acc"] == pytest.approx(on_shards["test/acc"], abs=1e-6)


# part: predict
@pytest.mark.slow
def test_a_model_trained_from_shards_predicts_on_the_source_images_as_on_the_shards(
    image_shards: Path, image_run: Path, here_for_inference: list[str]
):
    # On the source's image files, as a user predicts...
    images = image_shards / "images" / "images"
    predicted = api.predict([*here_for_inference, f"run_dir={image_run}", f"inputs={images}"])
    rows = json.loads((predicted.run_dir / "predictions.json").read_text())
    by_file = {row["file"]: row for row in rows}
    # ... the same outputs as the model on the test samples stored in the shards.
    model = load_model(TrainedRun(image_run / "checkpoints" / "best.ckpt", None))
    for file, (image, _) in decoded(image_shards / "shards", "test").items():
        with torch.no_grad():
            probabilities = model(image[None]).softmax(dim=1)[0]
        row = by_file[file]
        assert row["predicted"] == int(probabilities.argmax())
        assert row["probability"] == pytest.approx(float(probabilities.max()), abs=1e-5)

    # On the run's own test split (the shards'), each prediction with its sample: the run's test accuracy.
    on_split = api.predict([*here_for_inference, f"run_dir={image_run}"])
    trained = json.loads((image_run / "run.json").read_text())["final_metrics"]["test/acc"]
    assert on_split.metrics["predict/acc"] == pytest.approx(trained, abs=1e-6)


@pytest.mark.slow
def test_a_model_trained_from_shards_exports_an_artifact_that_answers_the_source_images_as_the_model(
    image_shards: Path, image_run: Path, here_for_inference: list[str], tmp_path: Path
):
    artifact = tmp_path / "model.onnx"
    exported = api.export([*here_for_inference, f"run_dir={image_run}", f"output={artifact}"])
    # Checked by the command itself on the run's test split: from the shards.
    assert "Parity check passed" in (exported.run_dir / "export.log").read_text()
    about = json.loads(artifact.with_name(artifact.name + ".json").read_text())
    assert about["input"]["shape"] == ["batch", 1, 28, 28] and about["input"]["image_mode"] == "L"
    assert about["class_names"] == facts(image_shards / "shards")["class_names"]

    # The artifact on the source's image files, read and preprocessed as its .json says (as a deployment does,
    # docs/predict-and-export.md), gives the model's outputs on the same test images as the shards hold them.
    preprocess = instantiate(about["input"]["preprocessing"])
    samples = decoded(image_shards / "shards", "test")
    mode = about["input"]["image_mode"]
    files = torch.stack([preprocess(Image.open(file).convert(mode)) for file in samples])
    shards = torch.stack([image for image, _ in samples.values()])
    model = load_model(TrainedRun(image_run / "checkpoints" / "best.ckpt", None))
    run = export_formats.FORMATS["onnx"].load(artifact, about["net"])
    with torch.no_grad():
        assert torch.allclose(run(files), model(shards), atol=1e-5)


# /part
# /part


# part: segmentation, folders
@pytest.fixture(scope="session")
def segmentation_shards(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """12 image/mask pairs (tests/test_segmentation_folder.py) and their shards (`shards/`)."""

    def build(folder: Path) -> None:
        segmentation_folder.write_folder(folder / "pairs")
        pairs = segmentation_folder.folder_overrides(folder / "pairs")
        shard(*pairs, output=folder / "shards", data_dir=data_dir)

    return built_once(tmp_path_factory, "segmentation_shards", build) / "shards"


@pytest.mark.slow
def test_a_segmentation_folder_is_sharded_with_its_masks_and_trained_from(
    segmentation_shards: Path, here: list[str]
):
    held = facts(segmentation_shards)
    assert held["encoding"] == "files" and held["task"] == "segmentation" and held["ignore_index"] == 255
    assert held["samples"] == {"train": 8, "val": 2, "test": 2}
    sample = stored(segmentation_shards, "val")[0]
    mask = Path(file_of(sample).replace("/images/", "/masks/")).with_suffix(".png")
    assert bytes(sample["mask"]) == mask.read_bytes()

    overrides = ["data=streaming", f"data.input_dir={segmentation_shards}", "data.batch_size=4"]
    overrides += [
        *segmentation_folder.TINY_UNET,
        "trainer.max_epochs=1",
        "seed=null",
    ]  # unseeded: any shuffle
    run = api.train([*here, *overrides])
    assert json.loads((run.run_dir / "run.json").read_text())["status"] == "completed"
    assert {"test/miou", "val/miou", "train/loss"} <= set(run.metrics)


# /part


# --- written once, and never taken for finished when it is not ---


@pytest.mark.slow
def test_the_same_command_again_does_nothing_and_another_config_is_refused(
    digit_shards: Path, data_dir: Path
):
    before = (digit_shards / FACTS_FILE).stat().st_mtime_ns
    log = shard("data=digits", "data.batch_size=128", output=digit_shards, data_dir=data_dir)
    assert "holds these shards already (shards.json): nothing to do" in log
    other = rf"output_dir={digit_shards} holds shards of another data config \(data.split: .*choose another"
    with pytest.raises(FileExistsError, match=other):
        shard("data=digits", "data.split=[1000,397,400]", output=digit_shards, data_dir=data_dir)
    assert (digit_shards / FACTS_FILE).stat().st_mtime_ns == before


@pytest.mark.slow
def test_a_half_written_output_is_refused_by_training_and_written_again_by_the_command(
    here: list[str], tmp_path: Path, data_dir: Path
):
    half = tmp_path / "half"  # what a shard command killed while writing leaves
    (half / "train").mkdir(parents=True)
    (half / "train" / "chunk-0-0.bin").write_bytes(b"\0" * 10)
    (half / PARTIAL_FILE).write_text("{}")
    unfinished = (
        rf"data.input_dir={half} is not finished.*run the shard command again, with the same output_dir"
    )
    with pytest.raises(ValueError, match=unfinished):
        api.train([*here, "data=streaming", f"data.input_dir={half}"])
    assert "is a half-written output of this command" in shard("data=digits", output=half, data_dir=data_dir)
    assert facts(half)["samples"] == {"train": 1297, "val": 250, "test": 250}
    assert not (half / PARTIAL_FILE).exists()

    theirs = tmp_path / "theirs"  # a folder the command did not write: never overwritten
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(
        FileExistsError, match=rf"output_dir={theirs} is not empty and holds no shards of this"
    ):
        shard("data=digits", output=theirs, data_dir=data_dir)
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_bad_shard_dirs_and_shards_that_do_not_fit_the_model_are_refused(
    digit_shards: Path, here: list[str], tmp_path: Path
):
    (tmp_path / "empty").mkdir()
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "data.csv").write_text("x")
    damaged = tmp_path / "damaged"
    shutil.copytree(digit_shards, damaged)
    chunk = sorted((damaged / "val").glob("*.bin"))[0]
    chunk.write_bytes(chunk.read_bytes()[:100])  # a copy that stopped halfway
    for name, error, message in [
        (
            "missing",
            FileNotFoundError,
            "does not exist; write shards there first: python src/shard.py data=<option>",
        ),
        ("empty", ValueError, "is empty; write shards there first"),
        ("theirs", ValueError, "holds no shards.json, so src/shard.py did not write it"),
        ("damaged", ValueError, f"chunk val/{chunk.name} is damaged (100 bytes instead of"),
    ]:
        with pytest.raises(
            error, match=re.escape(f"data.input_dir={tmp_path / name}") + ".*" + re.escape(message)
        ):
            api.train([*here, "data=streaming", f"data.input_dir={tmp_path / name}"])

    # Shards of another class count or task than the model, before anything is built.
    streaming = [*here, "data=streaming", f"data.input_dir={digit_shards}", "model.num_classes=3"]
    with pytest.raises(ValueError, match=r"model.num_classes=3 but data.num_classes=10"):
        api.train([*streaming, "model=classifier"])
    other_task = f"data.input_dir={digit_shards} holds classification shards but the model (SegmenterModule)"
    with pytest.raises(ValueError, match=re.escape(other_task)):
        api.train([*streaming, "model=segmenter"])


# --- exact resume, DDP, the run's length ---

# The digit shards with the MLP, 20 steps an epoch a rank on 2 ranks, every random choice seeded and
# deterministic.
EXACT = ["data=streaming", "model/net=mlp", "trainer.max_epochs=2", "trainer.deterministic=true"]


@pytest.mark.slow
def test_two_ranks_share_out_every_sample_once_and_a_run_killed_mid_epoch_resumes_to_the_same_weights(
    digit_shards: Path, here: list[str], tmp_path: Path
):
    """Killed 3 steps after the checkpoint of step 25 and run again, each rank is given the rest of the epoch
    the uninterrupted run's rank had (the checkpoint holds rank 0's loader state alone): the same end."""
    # Two ranks forked from this process (Lightning's ddp_fork): what is tested is the shards' loader under
    # DDP, not the launch (tests/test_ddp.py's). A kill leaves the files as the last finished checkpoint
    # write left them (tests/test_resume.py kills real processes): a copy of the run after each write.
    moments = tmp_path / "moments"
    snapshots = f"trainer.plugins=[{{_target_:tests.helpers.SnapshotCheckpointIO,folder:'{moments}'}}]"
    fork = ["trainer=ddp_sim", "trainer.strategy=ddp_fork", snapshots, "run_name=killed"]
    command = [*here, *EXACT, f"data.input_dir={digit_shards}", *fork]
    command += ["model/scheduler=warmup_cosine", "model.scheduler.warmup_steps=5"]  # [part: pretrained]
    command += [
        "callbacks.last_checkpoint.every_n_train_steps=5",
        "callbacks.model_checkpoint.every_n_train_steps=7",
        "+callbacks.record._target_=tests.test_streaming.RecordSamples",
        "+callbacks.record.folder=${paths.output_dir}/samples",
        "+callbacks.record.epoch=1",
    ]
    run_dir = api.train(command).run_dir
    whole = [json.loads((run_dir / "samples" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    # Each rank 20 batches of 32 (the global 64 split in two): 1280 of the 1297 training digits, none twice.
    assert [len(rank["seen"]) for rank in whole] == [640, 640]
    every = Counter(digest(image) for image, _ in stored(digit_shards, "train"))
    seen = Counter(whole[0]["seen"]) + Counter(whole[1]["seen"])
    assert not seen - every  # no sample more often than the shards hold it: the ranks' shares are disjoint
    assert every.total() - seen.total() == 17 < 2 * 32  # what drop_last leaves out: under a batch a rank
    # The run's length was known before it started (from the shards' index), and was its length.
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert whole[0]["planned_steps"] == whole[1]["planned_steps"] == checkpoint["global_step"] == 2 * 20
    assert checkpoint["lr_schedulers"][0]["total_steps"] == 40  # [part: pretrained]

    straight = outcome(run_dir)
    kills = sorted(moments.iterdir())
    step_25 = next(
        kill for kill in kills if load_checkpoint(kill / "checkpoints" / "last.ckpt")["global_step"] == 25
    )
    shutil.rmtree(run_dir)
    shutil.copytree(step_25, run_dir)  # the files as the write of step 25 left them (the next write: step 28)
    api.train(command)
    assert "Resuming run killed (stopped running)" in (run_dir / "train.log").read_text()
    done = 25 - 20  # the steps of epoch 1 before the checkpoint
    for rank in (0, 1):
        after = json.loads((run_dir / "samples" / f"rank{rank}.json").read_text())["seen"]
        assert len(after) == len(whole[rank]["seen"]) - done * 32  # a rank's share of data.batch_size=64
        assert after == whole[rank]["seen"][-len(after) :], f"rank {rank} resumed elsewhere in its epoch"
    # The same final and best weights, files, validation and test metrics, and the checkpoint tested. Not the
    # training metrics of the resumed epoch: a checkpoint holds rank 0's running sums alone, which both
    # ranks then continue from (docs/reliability.md).
    (got, weights), (expected, expected_weights) = outcome(run_dir), straight
    for facts in (got, expected):
        facts["metrics"] = {k: v for k, v in facts["metrics"].items() if not k.startswith("train/")}
    assert got == expected
    torch.testing.assert_close(weights, expected_weights, rtol=0, atol=0)


@pytest.mark.slow
def test_a_run_on_shards_killed_at_any_moment_and_run_again_ends_as_if_it_never_stopped(
    digit_shards: Path, here: list[str], tmp_path: Path
):
    """Each state a kill can leave (a copy of the run after each checkpoint write), put back and run again,
    ends as the run that never stopped. litdata's loader counts its own epochs: after a resume mid-epoch it
    read the next epoch in the order of the one it resumed (src/data/components/streaming_loader.py)."""
    moments = tmp_path / "moments"
    snapshots = f"trainer.plugins=[{{_target_:tests.helpers.SnapshotCheckpointIO,folder:'{moments}'}}]"
    saves = [*STEP_SAVES[:1], "callbacks.last_checkpoint.every_n_train_steps=6"]
    command = [*here, *EXACT, f"data.input_dir={digit_shards}", *saves, "model.net.dropout=0.2", snapshots]
    run_dir = api.train([*command, "run_name=any"]).run_dir
    expected = outcome(run_dir)
    kills = sorted(moments.iterdir())
    assert len(kills) >= 8
    for kill in kills:
        shutil.rmtree(run_dir)
        shutil.copytree(kill, run_dir)
        api.train([*command, "run_name=any"])
        assert_same_outcome(run_dir, expected, f"killed after checkpoint write {kill.name}")


class RecordSamples(L.Callback):
    """Writes `<folder>/rank<global rank>.json` at the end of epoch `epoch`: a digest of every training sample
    this rank was given in it, and the optimizer steps the run planned."""

    def __init__(self, folder: str, epoch: int = 0) -> None:
        self.folder = Path(folder)
        self.epoch = epoch
        self.seen: list[str] = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int
    ) -> None:
        if trainer.current_epoch == self.epoch:
            self.seen += [digest(image) for image in batch[0]]

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            record = {"seen": self.seen, "planned_steps": trainer.estimated_stepping_batches}
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def digest(image: torch.Tensor) -> str:
    return hashlib.sha256(image.cpu().contiguous().numpy().tobytes()).hexdigest()


@pytest.mark.slow
def test_shards_in_object_storage_train_through_the_cache_and_bad_urls_fail_naming_the_key(
    object_store: ObjectStore,
    here: list[str],
    tmp_path: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    """output_dir and data.input_dir at an s3:// URL, the server reached as a user of MinIO reaches it
    (AWS_ENDPOINT_URL and keys in the environment): the shard command writes there, training reads through
    data.cache_dir; a bucket that does not exist and a secret in the config fail naming the key."""
    url = f"s3://{object_store.bucket}/digits"
    written = run_cli("shard", "data=digits", f"output_dir={url}", log_dir=tmp_path, data_dir=data_dir,
                      env=object_store.env)  # fmt: skip
    assert written.returncode == 0, written.stderr[-3000:]
    stored = object_store.client().list_objects_v2(Bucket=object_store.bucket, Prefix="digits/")["Contents"]
    assert {"digits/shards.json", "digits/train/index.json"} <= {entry["Key"] for entry in stored}
    as_user(monkeypatch, object_store.env)  # in this process from here on
    assert "nothing to do" in shard("data=digits", output=url, data_dir=data_dir)

    cache = tmp_path / "cache"
    streaming = [*here, "data=streaming", f"data.input_dir={url}", f"data.cache_dir={cache}"]
    as_user(monkeypatch, {"AWS_ENDPOINT_URL": None})  # the endpoint from the config this time
    endpoint = f"+data.storage_options.endpoint_url={object_store.endpoint}"
    api.train([*streaming, "trainer.max_epochs=1", endpoint])
    assert list(cache.rglob("*.bin")), "no chunk reached the cache"

    as_user(monkeypatch, object_store.env)
    missing = "data.input_dir=s3://no-such-bucket/digits: there is no bucket no-such-bucket"
    with pytest.raises(FileNotFoundError, match=re.escape(missing)):
        api.train([*here, "data=streaming", "data.input_dir=s3://no-such-bucket/digits"])
    secret = r"^data.storage_options.aws_secret_access_key: credentials are not"
    with pytest.raises(ValueError, match=secret) as refused:
        api.train([*streaming, "+data.storage_options.aws_secret_access_key=hunter2"])
    assert "hunter2" not in str(refused.value)
