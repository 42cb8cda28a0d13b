"""Text from a user's side, offline, each task run as the command line runs it (src.api; the command line
itself for a sweep): a CSV of texts trains a tiny BERT saved with save_pretrained
(model.net.weights_dir), by overrides alone; eval, predict and export take the run; LoRA checkpoints are
small, refuse another base and export merged; a run stopped mid-epoch resumes to the same weights."""

import csv
import json  # [part: predict]
import re
from pathlib import Path

import pytest
import torch
from hydra.errors import InstantiationException

from src import api
from src.data.components.example_texts import make_example_texts
from src.run.trained_run import TrainedRun, load_model  # [part: predict]
from tests.conftest import built_once, only_run_dir, paths, run_cli
from tests.helpers import StopAt
from tests.test_resume import STOPPABLE, assert_same_outcome, outcome, record

LIMITS = [f"+trainer.limit_{stage}_batches=4" for stage in ("train", "val", "test")]  # a few batches suffice
TEXT_MODULE = "src.models.text_classifier_module.TextClassifierModule"
CLASSES = ["mixed", "negative", "positive"]  # the CSV's labels, sorted
SMALL_BERT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}


def save_bert(folder: Path, vocabulary_size: int, seed: int) -> Path:
    """A randomly initialised small BERT saved with save_pretrained, as a downloaded model is."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    config = AutoConfig.for_model("bert", vocab_size=vocabulary_size, num_labels=2, **SMALL_BERT)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def text_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """texts/{train,test}.csv (600 and 150 generated reviews: text,label) with their tokenizer, a BERT saved
    with that tokenizer's vocabulary (bert/, and its tokenizer beside it as a downloaded model has), and
    another BERT of other weights (other_bert/)."""

    def build(folder: Path) -> None:
        from transformers import AutoTokenizer

        texts = make_example_texts(folder / "texts", train=600, test=150)
        tokenizer = AutoTokenizer.from_pretrained(str(texts / "tokenizer"), local_files_only=True)
        for name, seed in (("bert", 0), ("other_bert", 1)):
            tokenizer.save_pretrained(str(save_bert(folder / name, len(tokenizer), seed)))

    return built_once(tmp_path_factory, "text_files", build)


def text_overrides(files: Path, *more: str) -> list[str]:
    """A user's own CSV and a save_pretrained folder, by overrides alone (docs/text.md's command)."""
    texts = files / "texts"
    model = ["model=text_classifier", "model/net=hf", f"model.net.weights_dir={files / 'bert'}"]
    data = [
        "data=text_file",
        f"data.train_file={texts / 'train.csv'}",
        f"data.test_file={texts / 'test.csv'}",
    ]
    return [*model, *data, "data.split=[0.8,0.2,0]", "data.num_classes=3", "data.max_length=32", *more]


@pytest.fixture(scope="session")
def text_run(tmp_path_factory: pytest.TempPathFactory, text_files: Path, data_dir: Path) -> Path:
    """One finished fine-tuning run of the BERT on the CSV (2 epochs), for the tests that take a run."""

    def train(log_dir: Path) -> None:
        overrides = text_overrides(text_files, "trainer.max_epochs=2", "run_name=text")
        api.train([*paths(log_dir, data_dir), *overrides])

    return built_once(tmp_path_factory, "text_run", train) / "train" / "runs" / "text"


@pytest.mark.slow
def test_a_csv_trains_and_evaluates_with_a_saved_model(text_run: Path, here: list[str]):
    trained = record(text_run)
    assert trained["status"] == "completed" and 0 <= trained["final_metrics"]["test/acc"] <= 1
    log = (text_run / "train.log").read_text()
    assert "Dynamic padding:" in log and "fewer" in log  # the padding saved, once
    checkpoint = torch.load(text_run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["class_names"] == CLASSES

    evaluated = api.evaluate([*here, f"run_dir={text_run}"])
    assert evaluated.metrics["test/acc"] == pytest.approx(trained["final_metrics"]["test/acc"])


# part: predict
@pytest.mark.slow
def test_predictions_on_a_text_file_and_a_table_need_only_the_run(
    text_run: Path, here_for_inference: list[str], tmp_path: Path
):
    texts = tmp_path / "reviews.txt"
    texts.write_text("the soup was not bad but the waiter was rude\n\nthe coffee was great\n")
    table = tmp_path / "reviews.jsonl"
    table.write_text('{"text": "the view was lovely and the wine was superb", "id": 7}\n')
    run_dirs = {}
    for inputs, count in ((texts, 2), (table, 1)):
        run_dirs[inputs.suffix] = api.predict(
            [*here_for_inference, f"run_dir={text_run}", f"inputs={inputs}"]
        ).run_dir
        rows = json.loads((run_dirs[inputs.suffix] / "predictions.json").read_text())
        assert len(rows) == count and rows[0]["index"] == 0
        assert rows[0]["predicted_name"] in CLASSES
        assert sum(t["probability"] for t in rows[0]["top_k"]) == pytest.approx(1.0, abs=1e-5)
    assert rows[0]["text"] == "the view was lovely and the wine was superb"
    header = (run_dirs[".txt"] / "predictions.csv").read_text().splitlines()[0]
    assert header == "index,text,predicted,predicted_name,probability,top_k"


@pytest.mark.slow
def test_the_onnx_export_takes_any_batch_and_length_and_brings_its_tokenizer(
    text_run: Path, here_for_inference: list[str], tmp_path: Path
):
    import onnxruntime
    from transformers import AutoTokenizer

    artifact = tmp_path / "export" / "texts.onnx"
    api.export([*here_for_inference, f"run_dir={text_run}", f"output={artifact}"])
    sidecar = json.loads(artifact.with_name("texts.onnx.json").read_text())
    assert sidecar["input"]["names"] == ["input_ids", "attention_mask"]
    assert sidecar["parity"]["max_diff"] <= 1e-5 and sidecar["class_names"] == CLASSES

    # The artifact alone, as a user deploys it: its tokenizer beside it, no checkpoint, no transformers model.
    tokenizer = AutoTokenizer.from_pretrained(str(artifact.parent / sidecar["input"]["tokenizer"]))
    session = onnxruntime.InferenceSession(str(artifact), providers=["CPUExecutionProvider"])
    model = load_model(TrainedRun(text_run / "checkpoints" / "best.ckpt", None), TEXT_MODULE)
    batches = [["the food was good"], ["the music was not noisy but the bread was cold", "the menu is fine"]]
    for texts in batches:  # any batch size, any length
        batch = tokenizer(texts, padding=True, return_tensors="np", return_token_type_ids=False)
        logits = session.run(None, dict(batch))[0]
        with torch.no_grad():
            expected = model({name: torch.from_numpy(array) for name, array in batch.items()})
        assert torch.allclose(torch.from_numpy(logits), expected, atol=1e-5)


# /part


@pytest.mark.slow
def test_a_lora_checkpoint_is_small_refuses_another_base_and_exports_merged(
    text_files: Path, text_run: Path, here: list[str], here_for_inference: list[str], tmp_path: Path
):
    overrides = text_overrides(text_files, "model.net.lora.r=4", "trainer.max_epochs=1", "run_name=lora")
    run_dir = api.train([*here, *overrides]).run_dir
    lora = run_dir / "checkpoints"
    full = (text_run / "checkpoints" / "last.ckpt").stat().st_size
    assert (lora / "last.ckpt").stat().st_size <= 0.10 * full
    state = torch.load(lora / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert any("lora_A" in name for name in state) and not any("word_embeddings" in name for name in state)

    # Loading it rebuilds the base from its folder and checks the base's weights by their hash.
    other = f"+model.net.weights_dir={text_files / 'other_bert'}"  # + : eval's own config has no model
    with pytest.raises(ValueError, match=re.escape(f"{other[1:]} has base weights with sha256")) as refused:
        api.evaluate([*here, f"run_dir={run_dir}", other])
    assert str(refused.value).endswith("give the base the run was trained with")

    # part: predict
    # torch.export: the merging is the export's, whatever the format (ONNX: the next test's, 4 s slower).
    artifact = tmp_path / "lora.pt2"
    api.export([*here_for_inference, f"run_dir={run_dir}", "format=torch_export", f"output={artifact}"])
    assert json.loads(artifact.with_name("lora.pt2.json").read_text())["parity"]["max_diff"] <= 1e-5
    # /part


@pytest.mark.slow
def test_a_text_run_on_two_gloo_ranks_is_one_run(text_files: Path, here: list[str], tmp_path: Path):
    # Ranks forked from here (ddp_fork): the text data under DDP is tested (length-grouped), not the launch.
    ddp = ["trainer=ddp_sim", "trainer.strategy=ddp_fork", "trainer.max_epochs=1"]
    api.train([*here, *text_overrides(text_files, *ddp, "data.group_by_length=true", *LIMITS)])
    trained = record(only_run_dir(tmp_path))
    assert trained["status"] == "completed" and trained["world_size"] == 2
    assert "test/acc" in trained["final_metrics"]


@pytest.mark.slow
def test_a_sweep_over_folds_in_bf16_runs_each_fold(text_files: Path, tmp_path: Path, data_dir: Path):
    folds = ["data.num_folds=2", "data.fold=0,1", "trainer.precision=bf16-mixed", "trainer.max_epochs=1"]
    overrides = text_overrides(text_files, *folds, *LIMITS)
    result = run_cli("train", "-m", *overrides, log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    with open(sweep / "summary.csv") as file:
        rows = list(csv.DictReader(file))
    assert sorted(row["data.fold"] for row in rows) == ["0", "1"]
    assert all(row["status"] == "completed" for row in rows)


@pytest.mark.slow
def test_a_text_run_stopped_mid_epoch_resumes_to_the_same_weights(text_files: Path, here: list[str]):
    # Length-grouped batches, 30 an epoch: the loader's place in the second epoch is what the resume restores.
    common = [*here, *text_overrides(text_files, "data.group_by_length=true", "data.batch_size=16")]
    common += ["trainer.max_epochs=2", STOPPABLE]
    straight = api.train([*common, "run_name=straight"]).run_dir
    StopAt.moment = (40, None)  # SIGTERM after step 40, as a cluster's preemption
    with pytest.raises(SystemExit):
        api.train([*common, "run_name=stopped"])
    resumed = api.train([*common, "run_name=stopped"]).run_dir  # the same command again
    assert_same_outcome(resumed, outcome(straight), "stopped at step 40")
    assert record(resumed)["resumed"]["previous"]["status"] == "interrupted"


@pytest.mark.slow
def test_a_bad_model_folder_or_lora_target_fails_naming_the_key_before_training(
    text_files: Path, here: list[str], tmp_path: Path
):
    # (A bad column: tests/test_text_file.py.) The net's own checks fail inside Hydra's instantiate of the model,
    # which wraps them (as the command line prints them too).
    no_model = tmp_path / "not_a_model"
    no_model.mkdir()
    for overrides, message in [
        (
            [f"model.net.weights_dir={no_model}", f"model.net.tokenizer={text_files / 'bert'}"],
            f"model.net.weights_dir={no_model} holds no config.json",
        ),
        (["model.net.lora.r=4", "model.net.lora.target_modules=[q_proj]"], "q_proj not in the bert model"),
    ]:
        with pytest.raises(InstantiationException, match=re.escape(message)):
            api.train([*here, *text_overrides(text_files, *overrides)])
    assert not list(tmp_path.glob("train/runs/*/checkpoints/*"))
