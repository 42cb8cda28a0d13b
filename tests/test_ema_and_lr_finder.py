"""Two training aids, each one documented override away: an exponential moving average of the weights
(`'callbacks=[default,ema]'`) and a learning-rate search before training (`'callbacks=[default,lr_finder]'`)."""

import csv
import json
import math
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import EMAWeightAveraging
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.tuner.lr_finder import _LRFinder
from omegaconf import OmegaConf
from PIL import Image

from src import api
from src.callbacks.lr_finder import steepest_descent
from src.run import preflight
from src.run.checkpoints import load_checkpoint
from src.run.trained_run import TrainedRun, load_model  # [part: predict]
from tests.conftest import CONFIG_DIR, built_once, paths
from tests.helpers import RecordWeights, StopAt

# Digits + MLP, 2 epochs of 6 steps, deterministic; the latest state saved every 4 steps; SIGTERM at
# StopAt.moment, as a cluster's preemption.
SHORT = [
    "data=digits", "model/net=mlp", "trainer.max_epochs=2", "+trainer.limit_train_batches=6",
    "trainer.deterministic=true", "callbacks.last_checkpoint.every_n_train_steps=4",
    "+callbacks.stop._target_=tests.helpers.StopAt",
]  # fmt: skip
DECAY = 0.8  # short runs: an average over the last few steps, far enough from the raw weights to tell apart
EMA = [*SHORT, "callbacks=[default,ema]", f"callbacks.ema.decay={DECAY}"]  # with the default warm-up
WARMUP_FRACTION = OmegaConf.load(CONFIG_DIR / "callbacks" / "ema.yaml").ema.warmup_fraction
# A cosine schedule: built with the optimizer, it must start from the rate found too.
LR_FINDER = [
    *SHORT, "model/scheduler=cosine", "callbacks=[default,lr_finder]",
    "callbacks.lr_finder.num_training_steps=30", "test=false",
]  # fmt: skip
RECORD_WEIGHTS = [
    "+callbacks.record._target_=tests.helpers.RecordWeights",
    "+callbacks.record.path=${paths.output_dir}/weights_by_step.pt",
]


def train_once(tmp_path_factory, data_dir: Path, name: str, overrides: list[str]) -> Path:
    """The run dir of `api.train([*overrides, "run_name=<name>"])`, trained once for the session."""

    def train(log_dir: Path) -> None:
        api.train([*paths(log_dir, data_dir), *overrides, f"run_name={name}"])

    return built_once(tmp_path_factory, f"{name}_run", train) / "train" / "runs" / name


@pytest.fixture(scope="session")
def ema_run(tmp_path_factory, data_dir: Path) -> Path:
    """A run with the average, which also saves its raw weights after every step (weights_by_step.pt)."""
    return train_once(tmp_path_factory, data_dir, "ema", [*EMA, *RECORD_WEIGHTS])


@pytest.fixture(scope="session")
def lr_finder_run(tmp_path_factory, data_dir: Path) -> Path:
    return train_once(tmp_path_factory, data_dir, "lr", LR_FINDER)


def stopped_and_resumed(overrides: list[str], here: list[str], moment: tuple[int, int | None]) -> Path:
    """A named run stopped by SIGTERM at `moment` (StopAt), then run again with the same overrides: its run dir."""
    StopAt.moment = moment
    with pytest.raises(SystemExit):
        api.train([*here, *overrides, "run_name=stopped"])
    return api.train([*here, *overrides, "run_name=stopped"]).run_dir


def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in b), [n for n in b if not torch.equal(a[n], b[n])]


@pytest.mark.parametrize("name", ["ema", "lr_finder"])
def test_each_turns_on_with_its_documented_override(compose_cfg, name: str):
    override = f"callbacks=[default,{name}]"
    assert f"'{override}'" in (CONFIG_DIR / "callbacks" / f"{name}.yaml").read_text()
    assert f"{name}:" in (CONFIG_DIR / "callbacks" / "default.yaml").read_text()  # listed in the header
    assert set(compose_cfg("train", [override]).callbacks) == set(compose_cfg("train").callbacks) | {name}


# --- ema ---


def ema_of(
    steps: list[dict[str, torch.Tensor]],
    decay: float,
    warmup_fraction: float | None = WARMUP_FRACTION,
    prefix="net.",
) -> dict[str, torch.Tensor]:
    """The net's floating-point tensors averaged over `steps`: the first copied, then the n-th update
    average = d * average + (1 - d) * weights, d = min(decay, 1 - 1 / (1 + warmup_fraction * n)), or d = decay
    without a warm-up (integer buffers, BatchNorm's step count, left out)."""
    average = {name: value.clone() for name, value in steps[0].items() if name.startswith(prefix)}
    average = {name: value for name, value in average.items() if value.is_floating_point()}
    for n, step in enumerate(steps[1:], start=1):
        d = decay if warmup_fraction is None else min(decay, 1 - 1 / (1 + warmup_fraction * n))
        average = {name: d * value + (1 - d) * step[name] for name, value in average.items()}
    return average


def fit_boring_model(*callbacks: L.Callback, tmp_path: Path) -> tuple[dict, list[dict[str, torch.Tensor]]]:
    """Lightning's BoringModel fitted for 8 steps with `callbacks`: its weights after fit (the average, with an
    averaging callback) and the raw weights after every step."""
    L.seed_everything(0)
    record = RecordWeights(str(tmp_path / "weights_by_step.pt"))
    trainer = L.Trainer(
        max_steps=8, callbacks=[*callbacks, record], accelerator="cpu", logger=False, limit_val_batches=0,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    module = BoringModel()
    trainer.fit(module)
    return module.state_dict(), record.steps


def ema_callback(compose_cfg, *overrides: str) -> L.Callback:
    return instantiate(compose_cfg("train", ["callbacks=[default,ema]", *overrides]).callbacks.ema)


def test_the_decay_warms_up_to_its_value(compose_cfg, tmp_path: Path):
    # After n updates the average spans 1 / (1 - d) = 1 + warmup_fraction * n updates, until `decay` caps d.
    assert WARMUP_FRACTION is not None  # on by default
    warmed = ema_callback(compose_cfg, "callbacks.ema.decay=0.6")
    spans = [1 / (1 - warmed.decay_after(torch.tensor(n)).item()) for n in (1, 2, 10)]
    assert spans == pytest.approx([1 + WARMUP_FRACTION * n for n in (1, 2, 10)])
    assert warmed.decay_after(torch.tensor(100)).item() == pytest.approx(0.6)
    plain_mean = ema_callback(compose_cfg, "callbacks.ema.warmup_fraction=1")  # of all updates, until `decay`
    assert [plain_mean.decay_after(torch.tensor(n)).item() for n in (1, 2, 3)] == pytest.approx(
        [1 / 2, 2 / 3, 3 / 4]
    )

    average, steps = fit_boring_model(warmed, tmp_path=tmp_path)
    for name, value in ema_of(steps, 0.6, WARMUP_FRACTION, prefix="layer.").items():
        torch.testing.assert_close(average[name], value, rtol=1e-6, atol=1e-7)


def test_without_the_warm_up_the_decay_is_constant_as_in_lightnings_ema(compose_cfg, tmp_path: Path):
    off = [
        ema_callback(compose_cfg, "callbacks.ema.decay=0.6", f"callbacks.ema.warmup_fraction={v}")
        for v in ("null", "false")
    ]
    assert [callback.warmup_fraction for callback in off] == [None, None]
    constant, steps = fit_boring_model(off[0], tmp_path=tmp_path)
    for name, value in ema_of(steps, 0.6, None, prefix="layer.").items():
        torch.testing.assert_close(constant[name], value, rtol=1e-6, atol=1e-7)
    lightnings, _ = fit_boring_model(EMAWeightAveraging(decay=0.6), tmp_path=tmp_path)
    assert_same_tensors(constant, lightnings)  # the very average Lightning's EMAWeightAveraging makes


class SaveAtStep(L.Callback):
    """Saves a checkpoint at the end of one step, before the callbacks after it in the list have run: as a
    user's own callback may, ahead of the average's update for that step."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def test_a_checkpoint_saved_before_the_averages_update_holds_that_steps_update(compose_cfg, tmp_path: Path):
    early = SaveAtStep(4, tmp_path / "step4.ckpt")
    _, steps = fit_boring_model(
        early, ema_callback(compose_cfg, "callbacks.ema.decay=0.6"), tmp_path=tmp_path
    )
    saved = load_checkpoint(early.path)
    assert saved["callbacks"]  # the average's state is in it, with its latest update at step 4
    for name, value in ema_of(steps[:4], 0.6, WARMUP_FRACTION, prefix="layer.").items():
        torch.testing.assert_close(saved["state_dict"][name], value, rtol=1e-6, atol=1e-7)
    assert_same_tensors(saved["current_model_state"], steps[3])  # and the raw weights of that step


@pytest.mark.slow
def test_a_short_run_with_the_average_tests_about_as_well_as_without_it(digits_run: Path, here: list[str]):
    # digits_run, 42 steps, with the default average: a constant decay of 0.99 would still hold most of the
    # first step's weights at the end; the warm-up keeps the average near the recent weights.
    overrides = ["data=digits", "model/net=mlp", "trainer.max_epochs=2", "callbacks=[default,ema]"]
    averaged = api.train([*here, *overrides, "run_name=ema"]).metrics
    raw = json.loads((digits_run / "run.json").read_text())["final_metrics"]
    assert averaged["test/acc"] >= raw["test/acc"] - 0.02


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "callbacks.ema.warmup_fraction=2",
            "callbacks.ema.warmup_fraction=2 is not valid; use a number above 0 and at most 1",
        ),
        ("callbacks.ema.warmup_fraction=0", "callbacks.ema.warmup_fraction=0 is not valid"),
        ("callbacks.ema.warmup_fraction=true", "callbacks.ema.warmup_fraction=true is not valid"),
        ("callbacks.ema.warmup_fraction=fast", "callbacks.ema.warmup_fraction=fast is not valid"),
        ("callbacks.ema.decay=1.5", "callbacks.ema.decay=1.5 is not valid; use a number from 0 to 1"),
    ],
)
def test_a_bad_ema_setting_is_refused_naming_the_key_and_what_is_valid(
    compose_cfg, override: str, message: str
):
    cfg = compose_cfg("train", ["callbacks=[default,ema]", override])
    with pytest.raises(Exception) as refused:
        instantiate(cfg.callbacks.ema)
    error = refused.value.__cause__ or refused.value  # Hydra wraps what the constructor raised
    assert isinstance(error, ValueError) and str(error).startswith(message) and "\n" not in str(error)


def test_the_average_is_what_best_ckpt_holds_and_what_test_eval_predict_and_export_use(
    ema_run: Path, here: list[str]
):
    best = load_checkpoint(ema_run / "checkpoints" / "best.ckpt")
    steps = torch.load(ema_run / "weights_by_step.pt", weights_only=True)
    expected = ema_of(steps[: best["global_step"]], DECAY)
    averaged, raw = best["state_dict"], best["current_model_state"]
    for name, value in expected.items():
        torch.testing.assert_close(averaged[name], value, rtol=1e-6, atol=1e-7)
        assert torch.equal(raw[name], steps[best["global_step"] - 1][name])  # the raw weights, kept beside
    assert max((averaged[name] - raw[name]).abs().max().item() for name in expected) > 1e-2

    # The test after training ran on the average too: eval.py, which knows nothing of the average and loads
    # best.ckpt's state_dict, gets the same numbers.
    evaluated = api.evaluate([*here, f"run_dir={ema_run}"]).metrics
    trained = json.loads((ema_run / "run.json").read_text())["final_metrics"]
    assert evaluated["test/loss"] == pytest.approx(trained["test/loss"], rel=1e-6)

    # part: predict
    # predict and export load the model as below (weights_only=True): the average.
    source = TrainedRun(ema_run / "checkpoints" / "best.ckpt", run_config=None)
    loaded = load_model(source).state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(loaded[name], value, rtol=1e-6, atol=1e-7)
    # /part


@pytest.mark.slow
@pytest.mark.parametrize(
    ("moment", "resumed_from"),
    [((9, None), "interrupted.ckpt"), ((6, 1), "last.ckpt")],
    ids=["mid-epoch", "in validation"],
)
def test_a_stopped_run_resumes_both_the_raw_weights_and_the_average(
    ema_run: Path, here: list[str], moment: tuple[int, int | None], resumed_from: str
):
    # Validation runs with the average swapped into the module: stopped in its middle (after step 6, the
    # epoch's last), the run saves no checkpoint and continues from last.ckpt of step 4, the raw weights and
    # the average each where they belong.
    run_dir = stopped_and_resumed(EMA, here, moment)
    assert json.loads((run_dir / "run.json").read_text())["resumed"]["checkpoint"].endswith(resumed_from)
    ended, straight = (load_checkpoint(run / "checkpoints" / "last.ckpt") for run in (run_dir, ema_run))
    for key in ("state_dict", "current_model_state", "averaging_state"):  # average, raw weights, step count
        assert_same_tensors(ended[key], straight[key])
    assert ended["averaging_state"]["n_averaged"] == straight["global_step"] == 12


@pytest.mark.slow
def test_a_run_killed_after_any_checkpoint_write_resumes_both_the_raw_weights_and_the_average(
    ema_run: Path, here: list[str], tmp_path: Path
):
    # Each write is atomic: a copy of the run dir after each one is every state a kill can leave it in.
    moments = tmp_path / "moments"
    snapshots = f"trainer.plugins=[{{_target_:tests.helpers.SnapshotCheckpointIO,folder:'{moments}'}}]"
    command = [*here, *EMA, snapshots, "run_name=killed"]
    run_dir = api.train(command).run_dir
    straight = load_checkpoint(ema_run / "checkpoints" / "last.ckpt")
    for kill in sorted(moments.iterdir()):
        shutil.rmtree(run_dir)
        shutil.copytree(kill, run_dir)
        api.train(command)  # the same command again
        ended = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
        for key in ("state_dict", "current_model_state", "averaging_state"):
            assert_same_tensors(ended[key], straight[key])


def test_a_weights_only_best_checkpoint_is_refused_with_the_average(compose_cfg):
    # Lightning saves a weights-only checkpoint without asking the callbacks: it would hold the raw weights.
    cfg = compose_cfg(
        "train", ["callbacks=[default,ema]", "callbacks.model_checkpoint.save_weights_only=true"]
    )
    with pytest.raises(ValueError, match=r"keep callbacks\.model_checkpoint\.save_weights_only=false"):
        preflight.check_run(cfg)


# --- lr_finder ---


def test_the_rate_found_trains_the_run_and_is_saved_with_its_curve(lr_finder_run: Path):
    found = json.loads((lr_finder_run / "lr_finder.json").read_text())
    suggestion = found["suggestion"]
    assert len(found["lr"]) == len(found["loss"]) == 30
    assert found["lr"][0] == 1e-8 < suggestion < 1.0 == found["max_lr"]
    assert json.loads((lr_finder_run / "run.json").read_text())["lr_finder"] == {"suggestion": suggestion}
    with Image.open(lr_finder_run / "lr_finder.png") as picture:
        assert picture.format == "PNG" and picture.width > 100

    last = load_checkpoint(lr_finder_run / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 12  # the search's steps were undone: training took its own 12
    assert last["hyper_parameters"]["optimizer"]["lr"] == suggestion  # what later loads say trained it
    assert last["optimizer_states"][0]["param_groups"][0]["initial_lr"] == suggestion
    assert last["lr_schedulers"][0]["base_lrs"] == [suggestion]  # the scheduler was built with it too
    with open(lr_finder_run / "csv" / "version_0" / "metrics.csv") as file:
        rates = [float(row["lr-Adam"]) for row in csv.DictReader(file) if row.get("lr-Adam")]
    assert rates[0] == pytest.approx(suggestion, rel=1e-6)  # the rate of the first epoch's steps (lr_monitor)


@pytest.mark.slow
def test_a_stopped_run_resumes_with_the_rate_found_without_searching_again(
    lr_finder_run: Path, here: list[str]
):
    run_dir = stopped_and_resumed(LR_FINDER, here, (9, None))
    log = (run_dir / "train.log").read_text()  # of both attempts
    assert "the learning rate is not searched again" in log
    assert log.count("Learning-rate finder: training with its suggestion") == 1  # searched by the first only
    found = json.loads((run_dir / "lr_finder.json").read_text())  # the first attempt's
    assert json.loads((run_dir / "run.json").read_text())["lr_finder"] == {"suggestion": found["suggestion"]}
    resumed = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert resumed["hyper_parameters"]["optimizer"]["lr"] == found["suggestion"]
    assert_same_tensors(
        resumed["state_dict"], load_checkpoint(lr_finder_run / "checkpoints" / "last.ckpt")["state_dict"]
    )


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["trainer=ddp_sim"], "trainer=ddp_sim: trainer.strategy=ddp, trainer.devices=2"),
        (["trainer=ddp_spawn", "trainer.accelerator=cpu", "trainer.devices=2"], "trainer.devices=2"),
        (["trainer=cpu", "trainer.devices=2"], "trainer=cpu: trainer.devices=2"),
        (["trainer.num_nodes=2"], "trainer.num_nodes=2"),
    ],
)
def test_the_lr_finder_is_refused_under_ddp_before_anything_starts(compose_cfg, overrides, named):
    cfg = compose_cfg("train", ["callbacks=[default,lr_finder]", *overrides])
    with pytest.raises(ValueError) as refused:
        preflight.check_run(cfg)
    message = str(refused.value)
    assert message.startswith(
        "callbacks.lr_finder finds the learning rate in one process, but this run trains"
    )
    assert (
        named in message and "train with model.optimizer.lr=<its suggestion> and without lr_finder" in message
    )
    assert "\n" not in message
    preflight.check_run(compose_cfg("train", ["callbacks=[default,lr_finder]", "trainer=cpu"]))  # one process


def test_the_suggestion_is_the_steepest_descent_on_the_log_scale_of_the_rates():
    # Flat with a little noise at tiny rates, then the loss falls between 1e-3 and 1e-1. Lightning 2.6 takes the
    # slope against the rate itself, where a step of 1e-8 between tiny rates magnifies any wiggle.
    lrs = [10 ** (-8 + 8 * i / 99) for i in range(100)]
    losses = [2.3 - min(1.0, max(0.0, (math.log10(lr) + 3) / 2)) for lr in lrs]
    losses[30] -= 0.01  # a wiggle around 2e-6
    finder = _LRFinder("exponential", 1e-8, 1.0, 100)
    finder.results = {"lr": lrs, "loss": losses}
    assert finder.suggestion() < 1e-5  # Lightning's: the wiggle
    best = steepest_descent(finder.results, "exponential")
    assert 1e-3 < lrs[best] < 1e-1  # ours: on the descent
    assert steepest_descent({"lr": lrs[:11], "loss": losses[:11]}, "exponential") is None  # too few points
