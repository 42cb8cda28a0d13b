"""DDP under Hydra: 2 CPU processes (gloo), one run directory per job, and no rank re-running the sweep."""

import json
from pathlib import Path

import pytest
import torch
import yaml

from src import api
from tests.conftest import ROOT, assert_single_run_dir, last_metrics, only_run_dir, paths, run_cli

TINY = ["data=digits", "model/net=mlp", "trainer.max_epochs=2"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "trainer",
    [
        ["trainer=ddp_sim"],
        ["trainer=ddp_spawn", "trainer.accelerator=cpu", "trainer.devices=2"],
    ],
)
def test_ddp_run_writes_one_run_dir_and_syncs_metrics(tmp_path: Path, data_dir: Path, trainer: list[str]):
    # A fold of k-fold cross-validation, whose validation set each rank records: every rank has the same one.
    fold = ["data.num_folds=3", "data.fold=1"]
    record = [
        "+callbacks.record_val._target_=tests.helpers.RecordValidationSet",
        f"+callbacks.record_val.folder={tmp_path / 'record'}",
    ]
    result = run_cli(
        "train",
        *trainer,
        *TINY,
        *fold,
        *record,
        log_dir=tmp_path,
        data_dir=data_dir,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in output  # the worker process really ran
    run_dir = only_run_dir(tmp_path)
    assert_single_run_dir(run_dir)
    assert not (tmp_path / "train" / "multiruns").exists()
    ranks = [json.loads((tmp_path / "record" / f"val_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and ranks[0]["size"] == 516  # fold 1 of the 1547 train+val digits

    # Synced metrics: the 2-process test accuracy (each rank saw half the test set) equals a
    # single-process evaluation of the same checkpoint on the whole test set (which folds leave as it is).
    ddp_acc = last_metrics(run_dir)["test/acc"]
    ckpt = run_dir / "checkpoints" / "best.ckpt"
    evaluated = api.evaluate(
        [*paths(tmp_path, data_dir), "data=digits", "model/net=mlp", f"ckpt_path={ckpt}"]
    )
    assert evaluated.metrics["test/acc"] == pytest.approx(ddp_acc)


@pytest.mark.slow
def test_multirun_of_ddp_jobs_runs_each_job_once_with_its_own_workers_in_bfloat16(
    tmp_path: Path, data_dir: Path
):
    result = run_cli(
        "train",
        "-m",
        "trainer=ddp_sim",
        *TINY,
        "trainer.precision=bf16-mixed,bf16-true",
        *["trainer.limit_train_batches=5", "trainer.limit_val_batches=2", "trainer.limit_test_batches=2"],
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("Launching 2 jobs locally") == 1  # no worker re-ran the sweep
    assert output.count("[rank: 1] Seed set to 42") == 2  # every job started its own worker

    sweeps = list((tmp_path / "train" / "multiruns").iterdir())
    assert len(sweeps) == 1, sweeps
    assert not (tmp_path / "train" / "runs").exists()
    jobs = sorted(p for p in sweeps[0].iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    # mixed: float32 weights, bfloat16 autocast; true: the weights themselves are bfloat16 (the net's
    # tensors; the metric states in the checkpoint keep torchmetrics' float32)
    for job, precision, weights in zip(
        jobs, ("bf16-mixed", "bf16-true"), (torch.float32, torch.bfloat16), strict=True
    ):
        assert_single_run_dir(job)
        hparams = yaml.safe_load((job / "csv" / "version_0" / "hparams.yaml").read_text())
        assert hparams["trainer"]["precision"] == precision
        checkpoint = torch.load(job / "checkpoints" / "last.ckpt", weights_only=True)
        net = [
            t
            for name, t in checkpoint["state_dict"].items()
            if name.startswith("net.") and t.is_floating_point()
        ]
        assert {t.dtype for t in net} == {weights}
        assert last_metrics(job)["test/acc"] > 0.5
    summary = (sweeps[0] / "summary.csv").read_text().splitlines()
    assert summary[0] == "job,status,val/acc_best,trainer.precision,error" and len(summary) == 3
    assert all(",completed," in line for line in summary[1:])
