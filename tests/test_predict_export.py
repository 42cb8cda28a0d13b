"""From a checkpoint to use: predictions on files or a test split, and exports that pass their parity check."""

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from src import api
from src.inference import export_formats
from src.inference.inputs import expand_inputs
from src.run.checkpoints import load_checkpoint
from src.run.trained_run import TrainedRun, load_model, with_run_precision
from tests.conftest import last_metrics


@pytest.fixture
def trained(digits_run: Path) -> Path:
    """A short real training run (the MLP on digits, shared by the session); its run dir."""
    return digits_run


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as file:
        return list(csv.DictReader(file))


def test_predictions_on_the_test_split_agree_with_trainer_test(trained: Path, here_for_inference: list[str]):
    out = api.predict([*here_for_inference, f"run_dir={trained}"]).run_dir
    rows = read_csv(out / "predictions.csv")
    assert len(rows) == 250  # the digits test split
    assert {row["predicted_name"] for row in rows} <= {str(i) for i in range(10)}
    accuracy = sum(row["predicted"] == row["label"] for row in rows) / len(rows)
    tested = json.loads((trained / "run.json").read_text())["final_metrics"]["test/acc"]
    assert accuracy == pytest.approx(tested)  # the same checkpoint (best.ckpt), the same samples
    detailed = json.loads((out / "predictions.json").read_text())
    top = detailed[0]["top_k"]
    assert len(top) == 5 and top[0]["class"] == detailed[0]["predicted"]
    assert [t["probability"] for t in top] == sorted((t["probability"] for t in top), reverse=True)


def test_predictions_on_image_files_need_only_the_checkpoint(
    trained: Path, digit_files: Path, tmp_path: Path, here_for_inference: list[str]
):
    checkpoint = tmp_path / "elsewhere" / "model.ckpt"  # outside any run dir: no config beside it
    checkpoint.parent.mkdir()
    checkpoint.write_bytes((trained / "checkpoints" / "best.ckpt").read_bytes())
    inputs = f"inputs=[{digit_files},{digit_files}/0_*.png]"  # a folder and a glob
    predicted = api.predict([*here_for_inference, f"ckpt_path={checkpoint}", inputs, "top_k=3"])
    rows = read_csv(predicted.run_dir / "predictions.csv")
    assert [Path(row["file"]).name for row in rows] == [f.name for f in sorted(digit_files.iterdir())] + [
        "0_0.png"
    ]
    assert all(len(row["top_k"].split(";")) == 3 for row in rows)
    correct = sum(row["predicted"] == Path(row["file"]).stem.split("_")[1] for row in rows)
    assert correct >= 4  # resized from 24x24 back to 8x8 as in training: mostly right


def test_eval_by_run_dir_tests_the_run_with_its_own_data_and_model(trained: Path, here: list[str]):
    """`python src/eval.py run_dir=<run>`: a run trained with data=digits model/net=mlp needs neither again."""
    # data.batch_size: a single key set on top of the run's data config, which stays the digits
    run = api.evaluate([*here, f"run_dir={trained}", "data.batch_size=100"])
    evaluated = json.loads((run.run_dir / "run.json").read_text())
    assert evaluated["config"]["data"]["batch_size"] == 100
    tested = json.loads((trained / "run.json").read_text())["final_metrics"]["test/acc"]
    assert evaluated["final_metrics"]["test/acc"] == pytest.approx(tested)
    assert evaluated["config"]["data"]["_target_"] == "src.data.digits_datamodule.DigitsDataModule"
    assert evaluated["config"]["model"]["net"]["_target_"] == "src.models.components.mlp.MLP"


@pytest.mark.slow
def test_eval_of_a_checkpoint_outside_a_run_dir_takes_its_training_options(
    trained: Path, tmp_path: Path, here: list[str]
):
    checkpoint = tmp_path / "elsewhere" / "model.ckpt"  # no run.json beside it
    checkpoint.parent.mkdir()
    checkpoint.write_bytes((trained / "checkpoints" / "best.ckpt").read_bytes())
    with pytest.raises(  # the default model/net (simple_cnn) is not the MLP it holds
        ValueError,
        match=rf"ckpt_path={re.escape(str(checkpoint))} does not fit this model \(.*\); "
        r"was it trained with another model=, model/net=, data= or mode=",
    ):
        api.evaluate([*here, f"ckpt_path={checkpoint}"])
    as_trained = ["data=digits", "model/net=mlp", f"ckpt_path={checkpoint}"]  # its training run's overrides
    run = api.evaluate([*here, *as_trained])
    tested = json.loads((trained / "run.json").read_text())["final_metrics"]["test/acc"]
    assert last_metrics(run.run_dir)["test/acc"] == pytest.approx(tested)


@pytest.mark.parametrize("fmt", ["onnx", "torch_export", "state_dict"])
@pytest.mark.slow
def test_each_export_format_passes_its_parity_check(
    trained: Path, tmp_path: Path, here_for_inference: list[str], fmt: str
):
    artifact = tmp_path / f"model.{fmt}"
    exported = api.export([*here_for_inference, f"run_dir={trained}", f"format={fmt}", f"output={artifact}"])
    assert "Parity check passed" in (exported.run_dir / "export.log").read_text()
    sidecar = json.loads(artifact.with_name(artifact.name + ".json").read_text())
    assert sidecar["format"] == fmt and sidecar["parity"]["max_diff"] <= 1e-5
    assert sidecar["input"]["shape"] == ["batch", 1, 8, 8] and sidecar["input"]["image_mode"] == "L"
    assert sidecar["class_names"] == [str(i) for i in range(10)] and sidecar["output"]["name"] == "logits"
    # Run the artifact on its own, on a batch size it was not exported with.
    model = load_model(TrainedRun(trained / "checkpoints" / "best.ckpt", None))
    images = torch.randn(5, 1, 8, 8)
    run = export_formats.FORMATS[fmt].load(artifact, sidecar["net"])
    with torch.no_grad():
        assert torch.allclose(run(images), model(images), atol=1e-5)


@pytest.mark.slow
def test_a_broken_export_fails_its_parity_check(trained: Path, tmp_path: Path, here_for_inference: list[str]):
    artifact = tmp_path / "exports" / "model.onnx"
    artifact.parent.mkdir()
    artifact.write_bytes(b"an earlier export")
    # ONNX Runtime differs by ~1e-7.
    strict = ["format=onnx", f"output={artifact}", "overwrite=true", "tolerance=1e-12"]
    with pytest.raises(
        ValueError, match=r"failed its parity check: its outputs differ from the model's by up to"
    ):
        api.export([*here_for_inference, f"run_dir={trained}", *strict])
    # Nothing of the failed export is kept, and the earlier artifact it would have replaced is untouched.
    assert [p.name for p in artifact.parent.iterdir()] == ["model.onnx"]
    assert artifact.read_bytes() == b"an earlier export"
    # A candidate that is another model fails at the default tolerance.
    model = load_model(TrainedRun(trained / "checkpoints" / "best.ckpt", None))
    other = load_model(TrainedRun(trained / "checkpoints" / "best.ckpt", None))
    with torch.no_grad():
        other.net.layers[-1].bias.add_(0.01)
    with pytest.raises(ValueError, match=r"failed its parity check: .* more than tolerance=1e-05"):
        export_formats.check_parity(model, other, torch.randn(8, 1, 8, 8), 1e-5, "rigged")


def test_the_parity_check_allows_float32_rounding_relative_to_the_largest_output():
    """A trained U-Net's ONNX export differed from the model by 1.5e-5 on logits up to 16: float32 rounding,
    allowed; the same difference on outputs below 1 is not."""
    images = torch.zeros(4, 1, 8, 8)

    def large(x: torch.Tensor) -> torch.Tensor:
        return torch.linspace(-16, 16, 11).repeat(len(x), 1)

    def small(x: torch.Tensor) -> torch.Tensor:
        return torch.linspace(-0.5, 0.5, 11).repeat(len(x), 1)

    worst = export_formats.check_parity(large, lambda x: large(x) + 1.5e-5, images, 1e-5, "rigged")
    assert worst == pytest.approx(1.5e-5 / 16, rel=0.1)
    with pytest.raises(ValueError, match=r"by up to 1.5e-05 \(relative .*\), more than tolerance=1e-05"):
        export_formats.check_parity(small, lambda x: small(x) + 1.5e-5, images, 1e-5, "rigged")


def test_an_artifact_whose_outputs_have_another_shape_fails_its_parity_check(trained: Path):
    model = load_model(TrainedRun(trained / "checkpoints" / "best.ckpt", None))
    with pytest.raises(ValueError, match=r"rigged gives outputs of shape \[8, 9\], the model \[8, 10\]"):
        export_formats.check_parity(model, lambda x: model(x)[:, :9], torch.randn(8, 1, 8, 8), 1e-5, "rigged")


def test_a_checkpoint_without_preprocessing_predicts_on_its_test_split_and_refuses_image_files(
    trained: Path, digit_files: Path, tmp_path: Path, here_for_inference: list[str]
):
    """What a project that took predict after training has: checkpoints that record no preprocessing."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    checkpoint = load_checkpoint(run / "checkpoints" / "best.ckpt")
    del checkpoint["hyper_parameters"]["preprocessing"]
    torch.save(checkpoint, tmp_path / "stripped.ckpt")  # not over the file it was read from (memory-mapped)
    (tmp_path / "stripped.ckpt").replace(run / "checkpoints" / "best.ckpt")
    api.predict([*here_for_inference, f"run_dir={run}"])
    with pytest.raises(
        ValueError, match=r"a checkpoint that records no preprocessing does not say how an image file becomes"
    ):
        api.predict([*here_for_inference, f"run_dir={run}", f"inputs={digit_files}"])


def test_inputs_without_image_files_are_refused(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match=rf"inputs={tmp_path} holds no image files \(\.png"):
        expand_inputs(str(tmp_path))


@pytest.mark.slow
def test_an_export_never_overwrites_unless_asked(
    trained: Path, tmp_path: Path, here_for_inference: list[str]
):
    args = [f"run_dir={trained}", "format=state_dict", f"output={tmp_path / 'w.pt'}"]
    api.export([*here_for_inference, *args])
    written = (tmp_path / "w.pt").read_bytes()
    with pytest.raises(
        FileExistsError,
        match=re.escape(f"{tmp_path / 'w.pt'} exists; give output=<another path>, or overwrite=true"),
    ):
        api.export([*here_for_inference, *args])
    assert (tmp_path / "w.pt").read_bytes() == written


@pytest.mark.parametrize(
    ("script", "args", "error", "message"),
    [
        (
            "predict",
            [],
            ValueError,
            "predict needs a checkpoint: ckpt_path=<file.ckpt> or run_dir=logs/train/runs/<run>",
        ),
        (
            "predict",
            ["ckpt_path=/nowhere/model.ckpt"],
            FileNotFoundError,
            "ckpt_path=/nowhere/model.ckpt does not exist",
        ),
        (
            "export",
            ["ckpt_path=/nowhere/model.ckpt"],
            FileNotFoundError,
            "ckpt_path=/nowhere/model.ckpt does not exist",
        ),
        (
            "export",
            ["run_dir=/nowhere"],
            FileNotFoundError,
            "run_dir=/nowhere has no checkpoints/best.ckpt or checkpoints/last.ckpt",
        ),
        (
            "export",
            ["run_dir=.", "format=tflite"],
            ValueError,
            "format=tflite is not an export format; choose one of onnx, torch_export, state_dict",
        ),
        (
            "predict",
            ["run_dir=RUN", "inputs=/nowhere/*.png"],
            FileNotFoundError,
            "inputs: /nowhere/*.png is not a file, a folder or a pattern",
        ),
        (
            "predict",  # a checkpoint outside any run dir knows no data to predict on
            ["ckpt_path=TMP/loose.ckpt"],
            ValueError,
            "predict needs images: give inputs=<image files, a folder or a glob>, or +data=<option>",
        ),
        (
            "export",
            ["run_dir=RUN", "format=state_dict", "output=TMP/w.pt", "parity_samples=1"],
            ValueError,
            "the parity check needs at least 2 inputs (parity_samples=1), found 1",
        ),
    ],
)
def test_bad_predict_and_export_input_is_refused(
    trained: Path, tmp_path: Path, here_for_inference: list[str], script, args, error, message
):
    shutil.copy(trained / "checkpoints" / "best.ckpt", tmp_path / "loose.ckpt")
    args = [arg.replace("RUN", str(trained)).replace("TMP", str(tmp_path)) for arg in args]
    with pytest.raises(error, match=re.escape(message)):
        getattr(api, script)([*here_for_inference, *args])


def test_onnx_without_the_export_extra_names_it(monkeypatch: pytest.MonkeyPatch):
    real = export_formats.importlib.util.find_spec
    monkeypatch.setattr(
        export_formats.importlib.util, "find_spec", lambda name: None if name == "onnxscript" else real(name)
    )
    with pytest.raises(
        ModuleNotFoundError, match=r"format=onnx needs the export extra \(missing: onnxscript\): pip install"
    ):
        export_formats.require(export_formats.ONNX_PACKAGES, "format=onnx")


def test_a_checkpoint_saved_from_a_torch_compiled_net_loads_too(trained: Path, tmp_path: Path):
    """Checkpoints written by code that wrapped the net in torch.compile carry `_orig_mod.` in their keys."""
    checkpoint = load_checkpoint(trained / "checkpoints" / "best.ckpt")
    checkpoint["state_dict"] = {
        name.replace("net.", "net._orig_mod.", 1): t for name, t in checkpoint["state_dict"].items()
    }
    foreign = tmp_path / "compiled.ckpt"
    torch.save(checkpoint, foreign)
    model = load_model(TrainedRun(foreign, None))
    reference = load_model(TrainedRun(trained / "checkpoints" / "best.ckpt", None))
    images = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(model(images), reference(images))


@pytest.mark.parametrize(
    ("trained", "used"),
    [
        ("bf16-mixed", "bf16-mixed"),
        ("64", "64"),
        ("16-mixed", "16-mixed" if torch.cuda.is_available() else 32),
        (None, 32),  # a checkpoint outside its run dir: eval's own
    ],
)
def test_eval_uses_the_training_runs_precision(trained: str | None, used: str | int):
    """A bf16 run is tested in bf16, so eval reproduces its test metrics; float16 needs CUDA, else 32."""
    run_config = {"trainer": {"precision": trained}} if trained else None
    cfg = OmegaConf.create({"trainer": {"precision": 32}})
    assert with_run_precision(cfg, TrainedRun(Path("best.ckpt"), run_config)).trainer.precision == used
