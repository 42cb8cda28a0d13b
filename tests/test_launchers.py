"""Scaling out by override only: torchrun on one node and on two, a SLURM job's requeue, the ranks' files.
And the cluster launchers: SLURM and local jobs through submitit.  [part: cluster]
However many processes a run has, it writes one run directory, from global rank 0.
"""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate  # [part: cluster]
from lightning.fabric.plugins.environments import SLURMEnvironment

from src.launch import environment
from tests.conftest import (
    CONFIG_DIR,
    assert_single_run_dir,
    cli_command,
    cli_env,
    free_port,
    last_metrics,
    only_run_dir,
    run_cli,
    start_cli,
    torchrun,
)
from tests.test_mlflow import mlflow_runs  # [part: mlflow]

TINY = ["data=digits", "model/net=mlp", "trainer.max_epochs=1"]
CPU_DDP = ["trainer=ddp", "trainer.accelerator=cpu"]
# torchrun gives each of several local ranks one thread; the two-node run gets the same, so both launches
# do the same float operations and must train bit-identical weights.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
LOGGERS: list[str] = []  # of the one-node run
# part: mlflow
# The one-node run also logs to MLflow: both ranks open its new store, rank 0 alone logs.
LOGGERS += ["logger=[csv,mlflow]"]
# /part


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_torchrun_on_one_node_and_on_two_nodes_trains_the_same_model_into_one_run_dir(
    tmp_path: Path, data_dir: Path
):
    # torchrun --nproc_per_node=2 src/train.py trainer=ddp trainer.accelerator=cpu trainer.devices=2
    one_node = tmp_path / "one_node"
    result = run_cli(
        "train",
        *CPU_DDP,
        "trainer.devices=2",
        *TINY,
        *LOGGERS,
        launcher=torchrun("--nproc_per_node=2", f"--master_port={free_port()}"),
        env=ONE_THREAD,
        log_dir=one_node,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in result.stdout + result.stderr
    assert_single_run_dir(only_run_dir(one_node))
    # part: mlflow
    _, (run,) = mlflow_runs(one_node, "train")  # both ranks opened the new store; one run, from rank 0
    assert run.info.status == "FINISHED" and run.data.params["run/world_size"] == "2"
    assert {"val/acc", "test/acc"} <= set(run.data.metrics)
    # /part

    # Two "nodes" on localhost, one process each: torchrun --nnodes=2 --node_rank=0|1 ...
    two_nodes = tmp_path / "two_nodes"
    port = free_port()
    nodes = [
        subprocess.Popen(
            cli_command(
                "train",
                *CPU_DDP,
                "trainer.devices=1",
                "trainer.num_nodes=2",
                *TINY,
                launcher=torchrun(
                    "--nnodes=2",
                    "--nproc_per_node=1",
                    f"--node_rank={rank}",
                    "--master_addr=127.0.0.1",
                    f"--master_port={port}",
                ),
                log_dir=two_nodes,
                data_dir=data_dir,
            ),
            env=cli_env(**ONE_THREAD),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]
    run_dir = only_run_dir(two_nodes)  # written by global rank 0; node 1 added nothing of its own
    assert_single_run_dir(run_dir)

    one, two = weights(only_run_dir(one_node)), weights(run_dir)
    assert one.keys() == two.keys()
    assert all(torch.equal(one[name], two[name]) for name in one)
    assert last_metrics(run_dir)["test/acc"] == last_metrics(only_run_dir(one_node))["test/acc"]


# part: cluster
@pytest.mark.slow
def test_submitit_local_runs_a_two_job_sweep_including_lightning_launched_ddp(tmp_path: Path, data_dir: Path):
    # Job 1 is DDP whose worker Lightning starts from inside a submitit job (whose argv is submitit's).
    result = run_cli(
        "train",
        "-m",
        "hydra/launcher=submitit_local",
        "trainer=cpu,ddp_sim",
        *TINY,
        log_dir=tmp_path,
        data_dir=data_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    assert sorted(p.name for p in sweep.iterdir() if not p.name.startswith(".")) == [
        "0",
        "1",
        "multirun.yaml",
        "summary.csv",  # written from the jobs' result.json, which each submitit job wrote itself
    ]
    assert (sweep / "summary.csv").read_text().count(",completed,") == 2
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 2  # each job ran as a submitit job
    for job in ("0", "1"):
        assert_single_run_dir(sweep / job)
        assert last_metrics(sweep / job)["test/acc"] > 0.8
    submitit_logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_log.*"))
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in submitit_logs


# /part


# part: cluster
def test_slurm_launcher_asks_for_one_task_per_gpu_and_lightnings_requeue_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Render the sbatch script that hydra/launcher=slurm would submit, with submitit's own code."""
    import submitit

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\n")  # submitit's SLURM executor checks that srun exists
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    scripts = []

    def render_instead_of_submitting(executor, function, *args):
        scripts.append(executor._executor._make_submission_file_text("python -m submitit.core._submit", "0"))
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", render_instead_of_submitting)
    overrides = ["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2"]
    overrides += [f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.launcher.partition=gpu"]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    launcher.launch([["model.optimizer.lr=0.01"]], initial_job_idx=0)

    (script,) = scripts
    for line in (
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gpus-per-node=4",
        "--signal=USR1@120",
        "--requeue",
        "--partition=gpu",
        "--time=240",
    ):
        assert f"#SBATCH {line}\n" in script, f"{line} missing from:\n{script}"


# /part


@pytest.mark.slow
def test_slurm_requeue_saves_a_checkpoint_and_the_requeued_job_resumes_from_it(
    tmp_path: Path, data_dir: Path
):
    """SIGUSR1 before the time limit: Lightning saves hpc_ckpt_1.ckpt and runs `scontrol requeue`; the job
    starts again with the same job id, in the same run dir, and resumes from that checkpoint."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol_calls.txt"
    # A stand-in for scontrol: record the call, then do what SLURM does to a requeued job: kill it.
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nkill -9 $PPID\n')
    (bin_dir / "scontrol").chmod(0o755)
    slurm = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "train",
        "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NNODES": "1",
        "SLURM_NODELIST": "localhost",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }
    overrides = ["data=digits", "model/net=mlp", "trainer.max_epochs=15", "callbacks.early_stopping=null"]
    run_dir = tmp_path / "logs" / "train" / "runs" / "slurm-4242"
    output = tmp_path / "first.out"

    first = start_cli(
        "train", *overrides, log_dir=tmp_path / "logs", data_dir=data_dir, output=output, env=slurm
    )
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoints" / "last.ckpt").exists():  # the first epoch has ended
        assert first.poll() is None and time.monotonic() < deadline, Path(f"{output}.err").read_text()[-3000:]
        time.sleep(0.05)
    first.send_signal(signal.SIGUSR1)
    assert first.wait(timeout=120) == -signal.SIGKILL  # killed by "SLURM" after the requeue
    assert calls.read_text().split() == ["requeue", "4242"]
    assert (run_dir / "hpc_ckpt_1.ckpt").exists()

    requeued = run_cli("train", *overrides, log_dir=tmp_path / "logs", data_dir=data_dir, env=slurm)
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    assert (
        f"Restoring states from the checkpoint path at {run_dir / 'hpc_ckpt_1.ckpt'}"
        in requeued.stdout + requeued.stderr
    )
    assert [p.name for p in (tmp_path / "logs" / "train" / "runs").iterdir()] == ["slurm-4242"]
    with open(run_dir / "csv" / "version_1" / "metrics.csv") as file:  # the requeued job's log
        epochs = [int(row["epoch"]) for row in csv.DictReader(file) if row["train/loss"]]
    assert min(epochs) > 0 and max(epochs) == 14  # it went on where it stopped, up to the last epoch


def test_only_global_rank_zero_counts_as_rank_zero(monkeypatch: pytest.MonkeyPatch):
    for name in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert environment.is_global_rank_zero()
    cases = [
        ({"RANK": "1", "LOCAL_RANK": "0"}, False),  # torchrun: node 1's first process
        ({"RANK": "0", "SLURM_PROCID": "3"}, True),  # srun torchrun: torchrun's rank wins
        ({"SLURM_PROCID": "2"}, False),
        ({"LOCAL_RANK": "1"}, False),  # a worker Lightning started
        ({"LOCAL_RANK": "0", "NODE_RANK": "1"}, False),
    ]
    for env, expected in cases:
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            assert environment.is_global_rank_zero() is expected, env


@pytest.mark.parametrize(
    ("env", "job_id"),
    [
        ({}, None),
        ({"SLURM_JOB_ID": "12"}, None),  # an allocation, but not a task started by srun or sbatch
        ({"SLURM_JOB_ID": "12", "SLURM_NTASKS": "2", "SLURM_JOB_NAME": "train"}, "12"),
        ({"SLURM_JOB_ID": "12", "SLURM_NTASKS": "2", "SLURM_JOB_NAME": "interactive"}, None),
        (
            {
                "SLURM_JOB_ID": "13",
                "SLURM_NTASKS": "1",
                "SLURM_ARRAY_JOB_ID": "12",
                "SLURM_ARRAY_TASK_ID": "1",
            },
            "12_1",
        ),
    ],
)
def test_slurm_jobs_are_detected_as_lightning_detects_them(monkeypatch, env, job_id):
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert environment.slurm_job_id() == job_id
    assert SLURMEnvironment.detect() is (job_id is not None)
    if job_id is not None:
        assert environment.run_dir_name("runs") == f"slurm-{job_id}"


@pytest.mark.parametrize(
    ("local_rank", "subdir", "handlers"), [("0", ".hydra", ["console", "file"]), ("1", None, ["console"])]
)
def test_ranks_other_than_zero_write_no_snapshot_and_no_log_file(
    monkeypatch, tmp_path: Path, local_rank, subdir, handlers
):
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        overrides = [f"hydra.runtime.output_dir={tmp_path}"]  # set by Hydra in a real run
        hydra_cfg = compose("train", overrides=overrides, return_hydra_config=True).hydra
    assert hydra_cfg.output_subdir == subdir
    assert list(hydra_cfg.job_logging.root.handlers) == handlers


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run the script itself")
def test_gpu_smoke_script_says_it_needs_a_gpu():
    script = CONFIG_DIR.parent / "scripts" / "gpu_smoke.sh"
    result = subprocess.run(
        ["bash", str(script)], env=cli_env(PY=sys.executable), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stdout.startswith("FAIL  no CUDA GPU is visible")
