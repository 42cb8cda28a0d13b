"""DDP under Hydra: 2 CPU processes (gloo), one run directory per job, and no rank re-running the sweep."""

import json
from pathlib import Path

import pytest
import torch

from src import api
from tests.conftest import ROOT, assert_single_run_dir, last_metrics, run_cli
from tests.test_tracking import wandb_records, wandb_run

TINY = ["data=digits", "model/net=mlp", "trainer.max_epochs=1"]


@pytest.mark.slow
def test_a_ddp_run_writes_one_run_dir_and_its_ranks_validate_on_one_fold(tmp_path: Path, data_dir: Path):
    # Lightning starts rank 1 by re-running the command, which composes and splits the data itself.
    overrides = ["trainer=ddp_sim", *TINY, "data.num_folds=3", "data.fold=1"]
    overrides += ["+callbacks.record_val._target_=tests.helpers.RecordValidationSet"]
    overrides += [f"+callbacks.record_val.folder={tmp_path / 'record'}"]
    result = run_cli("train", *overrides, log_dir=tmp_path, data_dir=data_dir, env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in result.stdout + result.stderr  # the worker process really ran
    (run_dir,) = (tmp_path / "train" / "runs").iterdir()
    assert_single_run_dir(run_dir)
    assert not (tmp_path / "train" / "multiruns").exists()
    ranks = [json.loads((tmp_path / "record" / f"val_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and ranks[0]["size"] == 516  # fold 1 of the 1547 train+val digits


@pytest.mark.slow
def test_ddp_spawn_from_python_as_in_a_notebook_syncs_the_test_metrics(here: list[str]):
    run = api.train([*here, "trainer=ddp_spawn", "trainer.accelerator=cpu", "trainer.devices=2", *TINY])
    logged = last_metrics(run.run_dir)  # by two copies of the CSV logger: the fit's and the test's
    assert "train/loss" in logged and logged["test/acc"] == pytest.approx(run.metrics["test/acc"])
    # Each rank tested half the test set: the synced accuracy is a one-process test's of the same checkpoint.
    evaluated = api.evaluate([*here, *TINY, f"ckpt_path={run.run_dir / 'checkpoints' / 'best.ckpt'}"])
    assert evaluated.metrics["test/acc"] == pytest.approx(run.metrics["test/acc"])


@pytest.mark.slow
def test_a_multirun_of_ddp_jobs_runs_each_once_with_one_wandb_run_each(tmp_path: Path, data_dir: Path):
    overrides = ["-m", "trainer=ddp_sim", *TINY, "trainer.precision=bf16-mixed,bf16-true"]
    overrides += ["logger=[csv,wandb]", "logger.wandb.log_model=all"]  # checkpoints as artifacts
    overrides += ["callbacks=[default,prediction_pictures]"]  # drawn on rank 0 only  [part: diagnostics]
    # WANDB_MODE=offline alone, as users may: Lightning refuses log_model with logger.wandb.offline=true.
    result = run_cli("train", *overrides, log_dir=tmp_path, data_dir=data_dir, env={"WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("Launching 2 jobs locally") == 1  # no worker re-ran the sweep
    assert output.count("[rank: 1] Seed set to 42") == 2  # every job started its own worker
    assert not (tmp_path / "train" / "runs").exists()
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    # mixed: float32 weights, bfloat16 autocast; true: the net's weights are bfloat16 (not the metric states)
    for job, precision, dtype in (("0", "bf16-mixed", torch.float32), ("1", "bf16-true", torch.bfloat16)):
        state = torch.load(sweep / job / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        net = {t.dtype for name, t in state.items() if name.startswith("net.") and t.is_floating_point()}
        assert net == {dtype} and last_metrics(sweep / job)["test/acc"] > 0.5
        wandb = wandb_run(sweep / job)  # one wandb run per job, in the sweep's group: rank 1 opened none
        assert wandb["run"].run_group == sweep.name and wandb["config"]["run"]["world_size"] == 2
        assert f"trainer.precision={precision}" in wandb["run"].display_name  # the job's overrides
        assert any("test/confusion_matrix/_type" in row for row in wandb["history"])  # [part: diagnostics]
        (run_file,) = (sweep / job).glob("wandb/offline-run-*/run-*.wandb")
        artifacts = [r.artifact for r in wandb_records(run_file) if r.WhichOneof("record_type") == "artifact"]
        assert artifacts and all(a.type == "model" for a in artifacts)
    assert wandb_run(sweep / "0")["run"].run_id != wandb["run"].run_id
