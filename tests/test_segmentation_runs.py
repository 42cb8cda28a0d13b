"""What a run can do, done by a segmentation run: DDP on two processes, resuming after a kill mid-epoch, an
Optuna search (hparams_search=segment_digits), torch.compile. The same commands as for classification, with
`experiment=segment_digits` on a few scenes."""

import json
from pathlib import Path

import pytest
import torch

from src import api
from src.models.segmenter_module import SegmenterModule
from src.run.checkpoints import load_checkpoint
from tests.conftest import ONE_BATCH, ROOT, SMALL_SCENES, last_metrics, only_run_dir, run_cli

# The experiment (channels-last, in the precision the CPU computes fast: trainer.precision=auto) with a 2-scale
# U-Net of 4 and 8 channels: what these tests check does not depend on the net's size or precision, and its
# steps cost a fraction of the experiment's 4 scales.
SEGMENT = ["experiment=segment_digits", *SMALL_SCENES, "model.net.channels=[4,8]", "logger=csv"]
WITH_TESTS = {"PYTHONPATH": str(ROOT)}  # so Hydra can load tests.helpers


@pytest.mark.slow
def test_a_ddp_segmentation_run_syncs_its_metrics_across_processes(
    tmp_path: Path, data_dir: Path, here: list[str]
):
    result = run_cli(
        "train", *SEGMENT, "trainer=ddp_sim", "trainer.max_epochs=1", log_dir=tmp_path, data_dir=data_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in result.stdout + result.stderr  # the second process really ran
    run_dir = only_run_dir(tmp_path)
    # Each rank tested half the scenes; the mIoU of their summed pixel counts is the one a single process
    # gets on all of them.
    single = last_metrics(api.evaluate([*here, f"run_dir={run_dir}"]).run_dir)
    for name in ("test/miou", "test/dice", "test/acc", "test/iou_background"):
        assert single[name] == pytest.approx(last_metrics(run_dir)[name], rel=1e-5), name


@pytest.mark.slow
def test_a_segmentation_run_killed_mid_epoch_resumes_to_the_same_weights_and_metrics(
    tmp_path: Path, data_dir: Path
):
    # 12 steps an epoch; the latest state is saved every 4 steps, and the first attempt dies at step 18.
    common = [
        *SEGMENT,
        "data.batch_size=16",
        "trainer.max_epochs=2",
        "trainer.deterministic=true",
        "callbacks.last_checkpoint.every_n_train_steps=4",
        "+callbacks.kill._target_=tests.helpers.KillAtStep",
    ]
    straight = run_cli(
        "train", *common, "run_name=straight", log_dir=tmp_path, data_dir=data_dir, env=WITH_TESTS
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = run_cli(
        "train", *common, "run_name=killed", log_dir=tmp_path, data_dir=data_dir,
        env=WITH_TESTS | {"KILL_AT_STEP": "18"},
    )  # fmt: skip
    assert killed.returncode == -9  # SIGKILL: no handler, no last words
    runs = tmp_path / "train" / "runs"
    assert load_checkpoint(runs / "killed" / "checkpoints" / "last.ckpt")["global_step"] == 16

    resumed = run_cli(
        "train", *common, "run_name=killed", log_dir=tmp_path, data_dir=data_dir, env=WITH_TESTS
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_checkpoint(runs / "killed" / "checkpoints" / "last.ckpt")["state_dict"]
    b = load_checkpoint(runs / "straight" / "checkpoints" / "last.ckpt")["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in b)
    final = {
        name: json.loads((runs / name / "run.json").read_text())["final_metrics"]
        for name in ("killed", "straight")
    }
    for name in ("test/miou", "val/miou_best", "train/loss"):
        assert final["killed"][name] == final["straight"][name], name


@pytest.mark.slow
def test_the_segmentation_search_runs_its_trials_and_ranks_them_by_val_miou(tmp_path: Path, data_dir: Path):
    result = run_cli(
        "train", "-m", "hparams_search=segment_digits", *SMALL_SCENES, *ONE_BATCH, "hydra.sweeper.n_trials=2",
        log_dir=tmp_path, data_dir=data_dir,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    study = tmp_path / "train" / "studies" / "segment_digits"
    assert (study / "optuna.db").is_file()
    summary = (study / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("job,status,val/miou_best,") and len(summary) == 3
    assert all(",completed," in line for line in summary[1:])
    values = [float(line.split(",")[2]) for line in summary[1:]]
    assert values == sorted(values, reverse=True)  # best first: mIoU is maximized


def test_a_compiled_segmenter_keeps_the_plain_nets_parameter_names():
    # A compiled run is run in full by tests/test_train.py: compiling is TaskModule's, the same for every task
    # (and compiling the U-Net on the CPU takes 40 s). What a segmentation checkpoint needs from it: the plain
    # net's parameter names, so that eval, predict and export load it without compiling.
    unet = {"_target_": "src.models.components.unet.UNet", "input_shape": [1, 16, 16], "num_classes": 3}
    settings = {"net": {**unet, "channels": [4, 8]}, "optimizer": {}, "num_classes": 3}
    compiled, plain = SegmenterModule(**settings, compile=True), SegmenterModule(**settings)
    compiled.configure_model()
    assert list(compiled.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(compiled.state_dict())
