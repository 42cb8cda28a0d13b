"""What a run can do, done by a segmentation run: DDP on two processes, resuming after a stop mid-epoch, an
Optuna search (hparams_search=segment_digits), torch.compile. The same commands as for classification, with
`experiment=segment_digits` on a few scenes."""

from pathlib import Path

import pytest

from src import api
from src.models.segmenter_module import SegmenterModule
from tests.conftest import ONE_BATCH, SMALL_SCENES, last_metrics, run_cli
from tests.helpers import StopAt
from tests.test_resume import STOPPABLE, assert_same_outcome, outcome, record

# The experiment (channels-last, in the precision the CPU computes fast: trainer.precision=auto) with a 2-scale
# U-Net of 4 and 8 channels: what these tests check does not depend on the net's size or precision, and its
# steps cost a fraction of the experiment's 4 scales.
SEGMENT = ["experiment=segment_digits", *SMALL_SCENES, "model.net.channels=[4,8]", "logger=csv"]


@pytest.mark.slow
def test_a_ddp_segmentation_run_syncs_its_metrics_across_processes(here: list[str]):
    # Two gloo ranks forked from this process (Lightning's ddp_fork): what is tested is the module's metrics
    # under DDP, not the launch (tests/test_ddp.py starts the processes trainer=ddp starts).
    run = api.train([*here, *SEGMENT, "trainer=ddp_sim", "trainer.strategy=ddp_fork", "trainer.max_epochs=1"])
    # Each rank tested half the scenes; the mIoU of their summed pixel counts is the one a single process
    # gets on all of them.
    single = last_metrics(api.evaluate([*here, f"run_dir={run.run_dir}"]).run_dir)
    for name in ("test/miou", "test/dice", "test/acc", "test/iou_background"):
        assert single[name] == pytest.approx(last_metrics(run.run_dir)[name], rel=1e-5), name


@pytest.mark.slow
def test_a_segmentation_run_stopped_mid_epoch_resumes_to_the_same_weights_and_metrics(here: list[str]):
    # 12 steps an epoch; the first attempt is stopped at step 18.
    common = [*here, *SEGMENT, "data.batch_size=16", "trainer.max_epochs=2", "trainer.deterministic=true"]
    common += [STOPPABLE]
    straight = api.train([*common, "run_name=straight"]).run_dir
    StopAt.moment = (18, None)  # SIGTERM after step 18, as a cluster's preemption
    with pytest.raises(SystemExit):
        api.train([*common, "run_name=stopped"])
    resumed = api.train([*common, "run_name=stopped"]).run_dir
    assert_same_outcome(resumed, outcome(straight), "stopped at step 18")
    assert record(resumed)["resumed"]["previous"]["status"] == "interrupted"


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
