"""data=text_file: your own texts in CSV, TSV, JSON lines or Parquet, tokenized once and padded per batch."""

import json
import logging
import pickle
import runpy
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from src.common.text import load_tokenizer, tokenizer_fingerprint
from src.data.components.example_texts import make_example_texts, make_tokenizer
from src.data.components.text_batches import LengthGroupedBatchSampler, epoch_batches, padding_saved
from src.data.text_datamodule import lengths_of
from tests.conftest import ROOT

WORDS = ["the", "food", "was", "good", "but", "the", "service", "was", "awful", "and", "the", "music",
         "seemed", "rather", "loud", "tonight"]  # fmt: skip


def texts_and_labels(count: int, classes: list[str]) -> list[tuple[str, str]]:
    """`count` texts of 3 to 14 words, labelled in turn by `classes`."""
    return [(" ".join(WORDS[: 3 + i % 12]) + f" {i}", classes[i % len(classes)]) for i in range(count)]


def write_table(
    path: Path, rows: list[tuple[str, str]], columns: tuple[str, str] = ("text", "label")
) -> Path:
    """`rows` as a CSV, TSV, JSON lines or Parquet file, by the suffix of `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(pa.table({name: [row[i] for row in rows] for i, name in enumerate(columns)}), path)
    elif path.suffix in (".jsonl", ".json"):
        path.write_text("".join(json.dumps(dict(zip(columns, row, strict=True))) + "\n" for row in rows))
    else:
        separator = "\t" if path.suffix == ".tsv" else ","
        lines = [separator.join(columns), *(separator.join(row) for row in rows)]
        path.write_text("\n".join(lines) + "\n")
    return path


def write_test_data(data_dir: Path) -> list[str]:
    """data=text_file for tests that run every data option (tests/test_data.py): 60 texts of two classes and a
    tokenizer made from them, and the overrides that describe them (the net from scratch takes the tokenizer)."""
    rows = texts_and_labels(60, ["good", "bad"])
    make_tokenizer([text for text, _ in rows], data_dir / "tokenizer")
    texts = write_table(data_dir / "texts.csv", rows)
    return [f"data.train_file={texts}", f"model.net.tokenizer={data_dir / 'tokenizer'}"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT-style WordPiece tokenizer made here from the test texts (no download)."""
    folder = tmp_path_factory.mktemp("tokenizer")
    make_tokenizer([text for text, _ in texts_and_labels(40, ["a"])], folder)
    return folder


@pytest.fixture
def text_file(compose_cfg, tmp_path: Path, tokenizer_dir: Path):
    """Build the datamodule from configs/data/text_file.yaml with overrides, as the builder does (the
    tokenizer given to the data directly: the net's config is not composed here)."""

    def _build(*overrides: str, setup: bool = True):
        data = ["data=text_file", f"data.tokenizer={tokenizer_dir}", f"data.cache_dir={tmp_path}/cache"]
        cfg = compose_cfg("train", [*data, *overrides])
        datamodule = instantiate(cfg.data, _convert_="all")
        if setup:
            datamodule.setup("fit")
        return datamodule

    return _build


def labels_of(dataset) -> list[int]:
    return [label for _, label in dataset]


def splits(datamodule) -> list:
    return [datamodule.data_train, datamodule.data_val, datamodule.data_test]


def sizes(datamodule) -> tuple[int, ...]:
    return tuple(map(len, splits(datamodule)))


def samples(dataset) -> list[tuple[list[int], int]]:
    return [(ids.tolist(), label) for ids, label in dataset]


# --- reading: formats, splits, classes ---


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".json", ".parquet"])
def test_every_format_reads_the_same_samples(text_file, tmp_path: Path, suffix: str):
    rows = texts_and_labels(30, ["neg", "pos"])
    reference = text_file(f"data.train_file={write_table(tmp_path / 'ref.csv', rows)}")
    datamodule = text_file(f"data.train_file={write_table(tmp_path / f'texts{suffix}', rows)}")
    assert list(map(samples, splits(datamodule))) == list(map(samples, splits(reference)))
    assert datamodule.hparams.class_names == ["neg", "pos"]


def test_one_file_is_split_stratified_and_the_same_on_every_run(text_file, tmp_path: Path):
    rows = texts_and_labels(60, ["a", "b", "c"])
    train_file = write_table(tmp_path / "texts.csv", rows)
    first = text_file(f"data.train_file={train_file}", "data.num_classes=3", "data.split=[0.6,0.2,0.2]")
    again = text_file(f"data.train_file={train_file}", "data.num_classes=3", "data.split=[0.6,0.2,0.2]")
    for split, size in (("train", 36), ("val", 12), ("test", 12)):
        labels = labels_of(getattr(first, f"data_{split}"))
        assert len(labels) == size and all(labels.count(c) == size // 3 for c in range(3)), split
        assert labels_of(getattr(again, f"data_{split}")) == labels
    texts = {tuple(ids) for split in splits(first) for ids, _ in samples(split)}
    assert len(texts) == 60  # every text in exactly one split


def test_integer_labels_are_indices_and_class_names_set_the_order(text_file, tmp_path: Path):
    indices = text_file(
        f"data.train_file={write_table(tmp_path / 'i.csv', texts_and_labels(20, ['0', '1']))}"
    )
    assert indices.hparams.class_names == ["0", "1"]
    named = write_table(tmp_path / "n.csv", texts_and_labels(20, ["pos", "neg"]))
    datamodule = text_file(f"data.train_file={named}", "data.class_names=[pos,neg]")
    assert datamodule.hparams.class_names == ["pos", "neg"]
    assert sum(labels_of(split).count(0) for split in splits(datamodule)) == 10  # "pos" is class 0, as listed


def test_separate_val_and_test_files_are_used_whole(text_file, tmp_path: Path):
    train = write_table(tmp_path / "train.csv", texts_and_labels(20, ["a", "b"]))
    val = write_table(tmp_path / "val.jsonl", texts_and_labels(6, ["b", "a"]))
    test = write_table(tmp_path / "test.parquet", texts_and_labels(4, ["a", "b"]))
    datamodule = text_file(
        f"data.train_file={train}", f"data.val_file={val}", f"data.test_file={test}", "data.split=[1.0,0,0]"
    )
    assert sizes(datamodule) == (20, 6, 4)
    assert labels_of(datamodule.data_val) == [1, 0] * 3


# --- bad input: one line each, naming the key ---


def refused(build, *overrides: str) -> str:
    """The one-line error building the datamodule with `overrides` fails with (a key checked when the datamodule
    is built fails inside Hydra's instantiate, which the command line unwraps)."""
    with pytest.raises((ValueError, FileNotFoundError, InstantiationException)) as error:
        build(*overrides)
    cause = error.value.__cause__ if isinstance(error.value, InstantiationException) else error.value
    assert isinstance(cause, ValueError | FileNotFoundError), repr(cause)
    message = str(cause)
    assert "\n" not in message, message
    return message


def test_a_missing_text_or_label_column_lists_the_columns_found(text_file, tmp_path: Path):
    train_file = write_table(
        tmp_path / "t.csv", texts_and_labels(10, ["a", "b"]), columns=("review", "label")
    )
    message = refused(text_file, f"data.train_file={train_file}")
    assert "data.text_column=text is not a column of data.train_file=" in message
    assert message.endswith("its columns are review, label")
    message = refused(
        text_file, f"data.train_file={train_file}", "data.text_column=review", "data.label_column=stars"
    )
    assert "data.label_column=stars" in message and "review, label" in message


def test_empty_texts_are_counted_and_refused_or_dropped_with_a_warning(text_file, tmp_path: Path, caplog):
    rows = texts_and_labels(20, ["a", "b"])
    rows[3], rows[7] = ("", "a"), ("   ", "b")
    train_file = write_table(tmp_path / "t.csv", rows)
    message = refused(text_file, f"data.train_file={train_file}")
    counted = f"data.train_file={train_file} has 2 empty text(s) in column text (the first in data row 4)"
    assert counted in message
    assert "data.drop_empty=true" in message
    with caplog.at_level(logging.WARNING):
        datamodule = text_file(f"data.train_file={train_file}", "data.drop_empty=true")
    assert sum(sizes(datamodule)) == 18
    assert "has 2 empty text(s) in column text: left out (data.drop_empty=true)" in caplog.text


def test_a_label_not_in_class_names_names_the_label_the_file_and_the_key(text_file, tmp_path: Path):
    train = write_table(tmp_path / "train.csv", texts_and_labels(10, ["pos", "neg"]))
    test = write_table(tmp_path / "test.tsv", [("fine food", "pos"), ("so so", "meh")])
    message = refused(
        text_file, f"data.train_file={train}", f"data.test_file={test}", "data.class_names=[neg,pos]",
        "data.split=[0.8,0.2,0]",
    )  # fmt: skip
    assert f"data.test_file={test}, data row 2: label 'meh' is not a class" in message
    assert "the classes (data.class_names) are neg, pos" in message


@pytest.mark.parametrize(
    ("labels", "overrides", "expected"),
    [
        (["a", "b", "c"], [], "data.num_classes=2 but data.train_file="),  # 3 names, 2 classes
        (["0", "1", "2"], [], "label '2' is not a class"),  # an index past num_classes
        (["a", "b"], ["data.class_names=[a,b,c]"], "data.class_names has 3 names but data.num_classes=2"),
        (["a", "b"], ["data.max_length=1"], "data.max_length=1 must be at least 2"),
        (["a", "b"], ["data.split=[0.8,0.2]"], "data.split=[0.8, 0.2] needs 3 entries"),
    ],
)
def test_labels_classes_and_keys_that_do_not_agree_are_refused(
    text_file, tmp_path: Path, labels, overrides, expected
):
    train_file = write_table(tmp_path / "t.csv", texts_and_labels(12, labels))
    assert expected in refused(text_file, f"data.train_file={train_file}", *overrides)


def test_files_that_do_not_exist_or_have_no_known_format_are_named_by_their_key(text_file, tmp_path: Path):
    train = write_table(tmp_path / "t.csv", texts_and_labels(10, ["a", "b"]))
    message = refused(
        text_file, f"data.train_file={train}", f"data.val_file={tmp_path}/none.csv", "data.split=[0.9,0,0.1]"
    )
    assert message.startswith(f"data.val_file={tmp_path}/none.csv does not exist")
    (tmp_path / "t.xlsx").write_text("x")
    assert "unknown format '.xlsx'" in refused(text_file, f"data.train_file={tmp_path}/t.xlsx")
    message = refused(
        text_file, f"data.train_file={train}", f"data.test_file={train}"
    )  # and the default split
    assert (
        "data.split=[0.8, 0.1, 0.1] draws a test share from data.train_file, but data.test_file is set"
        in message
    )


# --- tokenization: cache, truncation ---


def test_a_second_run_reads_the_token_cache_and_a_changed_file_is_tokenized_again(
    text_file, tmp_path: Path, caplog
):
    train_file = write_table(tmp_path / "t.csv", texts_and_labels(20, ["a", "b"]))
    with caplog.at_level(logging.INFO):
        first = text_file(f"data.train_file={train_file}")
    assert f"Tokenizing the 20 texts of {train_file}" in caplog.text
    (cached,) = (tmp_path / "cache").iterdir()
    written = cached.stat().st_mtime_ns
    assert cached.name.endswith(f"-{tokenizer_fingerprint(first.tokenizer)}-text.pt")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        second = text_file(f"data.train_file={train_file}")
    assert "Tokenizing" not in caplog.text and f"read from the cache {cached}" in caplog.text
    assert cached.stat().st_mtime_ns == written
    assert [ids.tolist() for ids, _ in second.data_train] == [ids.tolist() for ids, _ in first.data_train]
    write_table(train_file, texts_and_labels(21, ["a", "b"]))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        text_file(f"data.train_file={train_file}")
    assert "Tokenizing the 21 texts" in caplog.text and len(list((tmp_path / "cache").iterdir())) == 2


def test_long_texts_are_cut_to_max_length_keeping_sep_and_counted_once(text_file, tmp_path: Path, caplog):
    train_file = write_table(tmp_path / "t.csv", texts_and_labels(24, ["a", "b"]))
    with caplog.at_level(logging.WARNING):
        datamodule = text_file(f"data.train_file={train_file}", "data.max_length=8")
    tokenizer = datamodule.tokenizer
    cut = [sample for split in splits(datamodule) for sample in split]
    long = sum(len(tokenizer(" ".join(WORDS[: 3 + i % 12]) + f" {i}")["input_ids"]) > 8 for i in range(24))
    assert f"{long} of 24 texts are longer than data.max_length=8 tokens and were cut" in caplog.text
    assert "raise data.max_length" in caplog.text
    assert max(len(ids) for ids, _ in cut) == 8
    assert all(ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id for ids, _ in cut)


# --- batches: dynamic padding, length grouping, folds ---


def test_batches_are_padded_to_their_own_longest_text(text_file, tmp_path: Path, caplog):
    train_file = write_table(tmp_path / "t.csv", texts_and_labels(40, ["a", "b"]))
    with caplog.at_level(logging.INFO):
        datamodule = text_file(
            f"data.train_file={train_file}", "data.batch_size=8", "data.split=[0.8,0.1,0.1]"
        )
        loader = datamodule.train_dataloader()
    for inputs, labels in loader:
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        assert ids.dtype == mask.dtype == labels.dtype == torch.long and ids.shape == mask.shape
        assert ids.shape[1] == mask.sum(1).max() < 128  # the longest of this batch, not max_length
        assert (ids[mask == 0] == datamodule.tokenizer.pad_token_id).all() and labels.shape == (len(ids),)
    val_inputs, _ = next(iter(datamodule.val_dataloader()))
    assert val_inputs["input_ids"].shape[1] == val_inputs["attention_mask"].sum(1).max()
    dynamic, full = padding_saved(lengths_of(datamodule.data_train), epoch_batches(loader.batch_sampler), 128)
    assert full == 32 * 128  # 32 training texts and dynamic < full / 4
    assert f"Dynamic padding: {dynamic:,} token positions per epoch instead of {full:,}" in caplog.text
    restored = pickle.loads(pickle.dumps(datamodule.collate_fn))  # worker processes receive it pickled
    assert restored.pad_token_id == datamodule.tokenizer.pad_token_id


def test_length_grouped_batches_pad_less_and_resume_mid_epoch_with_the_same_batches(
    text_file, tmp_path: Path
):
    train_file = write_table(tmp_path / "t.csv", texts_and_labels(200, ["a", "b"]))
    files = [f"data.train_file={train_file}", f"data.val_file={train_file}", f"data.test_file={train_file}"]
    overrides = [*files, "data.batch_size=4", "data.split=[1.0,0,0]"]
    random_order = text_file(*overrides)
    grouped = text_file(*overrides, "data.group_by_length=true")
    loaders = {name: dm.train_dataloader() for name, dm in (("random", random_order), ("grouped", grouped))}
    loader = loaders["grouped"]
    assert isinstance(loader.batch_sampler, LengthGroupedBatchSampler)
    lengths = lengths_of(grouped.data_train)
    saved = {
        name: padding_saved(lengths, epoch_batches(dl.batch_sampler), 128)[0] for name, dl in loaders.items()
    }
    assert saved["grouped"] < 0.9 * saved["random"]
    batches = [inputs["input_ids"].tolist() for inputs, _ in loader]
    assert len(batches) == len(loader) == 50
    assert sorted(x for batch in epoch_batches(loader.batch_sampler) for x in batch) == list(range(200))

    seen = iter(loader)
    for _ in range(7):
        next(seen)
    state = loader.state_dict()
    resumed = grouped.train_dataloader()  # a new process: the same seed, from the checkpoint's state
    resumed.load_state_dict(state)
    assert [inputs["input_ids"].tolist() for inputs, _ in resumed] == batches[7:]
    resumed.batch_sampler.sampler.set_epoch(1)
    assert [inputs["input_ids"].tolist() for inputs, _ in resumed] != batches  # another order next epoch


def test_folds_pool_separate_train_and_val_files_and_are_stratified(text_file, tmp_path: Path):
    train = write_table(tmp_path / "train.csv", texts_and_labels(24, ["a", "b"]))
    val = write_table(
        tmp_path / "val.csv", [(f"also {t}", label) for t, label in texts_and_labels(6, ["a", "b"])]
    )
    pooled = [f"data.train_file={train}", f"data.val_file={val}", "data.split=[18,0,6]", "data.num_folds=3"]
    folds = [text_file(*pooled, f"data.fold={fold}") for fold in range(3)]
    validated = [sorted(tuple(ids.tolist()) for ids, _ in dm.data_val) for dm in folds]
    assert [len(v) for v in validated] == [8, 8, 8]  # 18 of train.csv and the 6 of val.csv, in 3 folds
    assert len({text for fold in validated for text in fold}) == 24  # each text validates once
    for dm in folds:
        assert sorted(labels_of(dm.data_val)) == [0] * 4 + [1] * 4
        assert len(dm.data_train) == 16 and lengths_of(dm.data_train) == [
            len(ids) for ids, _ in dm.data_train
        ]
        dm.hparams.group_by_length = True
        batches = epoch_batches(dm.train_dataloader().batch_sampler)
        assert sorted(x for batch in batches for x in batch) == list(range(16))


# --- the example and its baseline ---


def test_the_example_is_generated_deterministically_with_its_tokenizer(tmp_path: Path):
    first, second = (make_example_texts(tmp_path / name, train=300, test=50) for name in ("one", "two"))
    for name in ("train.csv", "test.csv", "tokenizer/tokenizer.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert make_example_texts(first, exist_ok=True) == first  # kept as it is
    with pytest.raises(FileExistsError, match="already exists"):
        make_example_texts(first)
    tokenizer = load_tokenizer(str(first / "tokenizer"))
    assert tokenizer.pad_token_id == 0 and tokenizer.convert_ids_to_tokens(tokenizer("Not BAD")["input_ids"]) == [
        "[CLS]", "not", "bad", "[SEP]",
    ]  # fmt: skip
    assert (first / "train.csv").read_text().splitlines()[0] == "text,label"


def test_data_example_texts_builds_itself_and_describes_it(compose_cfg, tmp_path: Path, data_dir: Path):
    cfg = compose_cfg("train", ["data=example_texts", f"data.cache_dir={tmp_path}"])  # with its own tokenizer
    datamodule = instantiate(cfg.data, _convert_="all")  # writes the folder when missing
    datamodule.setup("fit")
    assert sizes(datamodule) == (5400, 600, 1000)
    assert datamodule.hparams.class_names == ["negative", "mixed", "positive"]
    # part: predict
    assert datamodule.inference_preprocessing() == {
        "kind": "text", "tokenizer": f"{data_dir}/example_texts/tokenizer", "max_length": 64, "text_column": "text",
    }  # fmt: skip
    # /part


def test_the_bag_of_words_baseline_stays_well_below_perfect(data_dir: Path, capsys: pytest.CaptureFixture):
    folder = make_example_texts(data_dir / "example_texts", exist_ok=True)
    baseline = runpy.run_path(str(ROOT / "scripts" / "text_baseline.py"))  # the script's functions
    baseline["main"](["--train", str(folder / "train.csv"), "--test", str(folder / "test.csv")])
    accuracy = float(capsys.readouterr().out.split("test accuracy ")[1].split()[0])
    assert 0.7 < accuracy < 0.85  # word order decides the rest (src/data/components/example_texts.py)
