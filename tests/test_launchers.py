"""Scaling out by override only: torchrun on two nodes, a SLURM job's requeue, the ranks' files.
And the cluster launchers: SLURM and local jobs through submitit.  [part: cluster]
However many processes a run has, it writes one run directory, from global rank 0."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE, STDOUT

import pytest
import torch
from hydra.utils import instantiate  # [part: cluster]
from lightning.fabric.plugins.environments import SLURMEnvironment

from src import api
from src.launch import environment
from tests.conftest import ROOT, assert_single_run_dir, cli_command, free_port, run_cli, start_cli, torchrun
from tests.test_mlflow import mlflow_runs  # [part: mlflow]

TINY = ["data=digits", "model/net=mlp", "trainer.max_epochs=1"]
CPU_DDP = ["trainer=ddp", "trainer.accelerator=cpu", *TINY]
LOGGERS: list[str] = []  # of the torchrun run
# part: mlflow
# The torchrun run also logs to MLflow: both ranks open its new store, rank 0 alone logs.
LOGGERS += ["logger=[csv,mlflow]"]
# /part
# What sbatch gives the one task of job 4242.
SLURM_TASK = "SLURM_JOB_ID=4242 SLURM_JOB_NAME=train SLURM_NTASKS=1 SLURM_NTASKS_PER_NODE=1 SLURM_NNODES=1"
SLURM_TASK += " SLURM_NODELIST=localhost SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0"


def variables(text: str) -> dict[str, str]:
    """`NAME=value NAME=value`, as a shell reads it."""
    return dict(item.split("=", 1) for item in text.split())


def torchrun_train(log_dir: Path, data_dir: Path, launches: list[list[str]], *overrides: str) -> list[str]:
    """`torchrun <args> src/train.py trainer=ddp trainer.accelerator=cpu <overrides>` for each `args` of
    `launches`, all at once; their outputs, once all have succeeded."""
    train, paths = ["train", *CPU_DDP, *overrides], {"log_dir": log_dir, "data_dir": data_dir}
    commands = [cli_command(*train, launcher=torchrun(*args), **paths) for args in launches]
    processes = [subprocess.Popen(c, stdout=PIPE, stderr=STDOUT, text=True) for c in commands]
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    assert all(process.returncode == 0 for process in processes), "\n".join(outputs)[-3000:]
    return outputs


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_torchrun_on_two_nodes_trains_the_model_two_ranks_on_one_node_train(
    tmp_path: Path, data_dir: Path, here: list[str]
):
    # Two "nodes" on localhost, one process each: torchrun --nnodes=2 --node_rank=0|1 ... (on one node:
    # torchrun --nproc_per_node=2 src/train.py trainer=ddp trainer.accelerator=cpu trainer.devices=2).
    two, port = tmp_path / "two_nodes", free_port()
    two_nodes = [["--nnodes=2", f"--node_rank={rank}", f"--master_port={port}"] for rank in (0, 1)]
    outputs = torchrun_train(two, data_dir, two_nodes, "trainer.devices=1", "trainer.num_nodes=2", *LOGGERS)
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]
    # Written by global rank 0 alone: node 1's process is its node's local rank 0.
    (run_dir,) = (two / "train" / "runs").iterdir()  # not one per rank
    assert_single_run_dir(run_dir)
    # part: mlflow
    _, (run,) = mlflow_runs(two, "train")  # both ranks opened the new store; one run
    assert run.info.status == "FINISHED" and run.data.params["run/world_size"] == "2"
    assert {"val/acc", "test/acc"} <= set(run.data.metrics)
    # /part
    # Two ranks on one node, forked from this process (Lightning's ddp_fork), train the same model: torchrun
    # and the tests give each process one thread (OMP_NUM_THREADS), so the same float operations.
    one_node = api.train([*here, *CPU_DDP, "trainer.devices=2", "trainer.strategy=ddp_fork"]).run_dir
    one, other = weights(one_node), weights(run_dir)
    assert one.keys() == other.keys() and all(torch.equal(one[name], other[name]) for name in one)


# part: cluster
@pytest.mark.slow
def test_submitit_local_runs_a_two_job_sweep_including_lightning_launched_ddp(tmp_path: Path, data_dir: Path):
    # Job 1 is DDP whose worker Lightning starts from inside a submitit job (whose argv is submitit's).
    overrides = ["-m", "hydra/launcher=submitit_local", "trainer=cpu,ddp_sim", *TINY]
    result = run_cli("train", *overrides, log_dir=tmp_path, data_dir=data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    # summary.csv: from the jobs' result.json, which each submitit job wrote itself
    assert sorted(p.name for p in sweep.iterdir()) == [".submitit", "0", "1", "multirun.yaml", "summary.csv"]
    assert (sweep / "summary.csv").read_text().count(",completed,") == 2
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 2  # each job ran as a submitit job
    for job in ("0", "1"):
        assert_single_run_dir(sweep / job)
    submitit_logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_log.*"))
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in submitit_logs


def test_slurm_launcher_asks_for_one_task_per_gpu_and_lightnings_requeue_signal(tmp_path: Path, monkeypatch):
    """Render the sbatch script that hydra/launcher=slurm would submit, with submitit's own code."""
    import submitit

    (tmp_path / "srun").write_text("#!/bin/sh\n")  # submitit's SLURM executor checks that srun exists
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    scripts = []

    def render_instead_of_submitting(executor, function, *args):
        scripts.append(executor._executor._make_submission_file_text("python -m submitit.core._submit", "0"))
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", render_instead_of_submitting)
    overrides = ["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2"]
    overrides += [f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.launcher.partition=gpu"]
    cfg = api.compose("train", overrides)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    launcher.launch([["model.optimizer.lr=0.01"]], initial_job_idx=0)
    (script,) = scripts
    expected = ["--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--signal=USR1@120", "--requeue"]
    for line in (*expected, "--partition=gpu", "--time=240"):
        assert f"#SBATCH {line}\n" in script, f"{line} missing from:\n{script}"


# /part


@pytest.mark.slow
def test_a_slurm_requeue_saves_a_checkpoint_the_requeued_job_resumes_from(tmp_path: Path, data_dir: Path):
    """SIGUSR1 before the time limit: Lightning saves hpc_ckpt_1.ckpt and runs `scontrol requeue`; the job
    starts again with the same job id, in the same run dir, and resumes from that checkpoint."""
    calls = tmp_path / "scontrol_calls.txt"
    # A stand-in for scontrol: record the call, then do what SLURM does to a requeued job: kill it.
    (tmp_path / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nkill -9 $PPID\n')
    (tmp_path / "scontrol").chmod(0o755)
    slurm = variables(SLURM_TASK) | {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    overrides = ["data=digits", "model/net=mlp", "trainer.max_epochs=15", "callbacks.early_stopping=null"]
    logs, output = tmp_path / "logs", tmp_path / "first.out"
    run_dir = logs / "train" / "runs" / "slurm-4242"

    first = start_cli("train", *overrides, log_dir=logs, data_dir=data_dir, output=output, env=slurm)
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoints" / "last.ckpt").exists():  # the first epoch has ended
        assert first.poll() is None and time.monotonic() < deadline, Path(f"{output}.err").read_text()[-3000:]
        time.sleep(0.05)
    first.send_signal(signal.SIGUSR1)
    assert first.wait(timeout=120) == -signal.SIGKILL  # killed by "SLURM" after the requeue
    assert calls.read_text().split() == ["requeue", "4242"] and (run_dir / "hpc_ckpt_1.ckpt").exists()

    requeued = run_cli("train", *overrides, log_dir=logs, data_dir=data_dir, env=slurm)
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    restored = f"Restoring states from the checkpoint path at {run_dir / 'hpc_ckpt_1.ckpt'}"
    assert restored in requeued.stdout + requeued.stderr
    assert [p.name for p in (logs / "train" / "runs").iterdir()] == ["slurm-4242"]
    with open(run_dir / "csv" / "version_1" / "metrics.csv") as file:  # the requeued job's log
        epochs = [int(row["epoch"]) for row in csv.DictReader(file) if row["train/loss"]]
    assert min(epochs) > 0 and max(epochs) == 14  # it went on where it stopped, up to the last epoch


@pytest.mark.parametrize(
    ("env", "rank_zero", "job_id"),
    [
        ("", True, None),
        ("RANK=1 LOCAL_RANK=0", False, None),  # torchrun: node 1's first process
        ("RANK=0 SLURM_PROCID=3", True, None),  # srun torchrun: torchrun's rank wins
        ("SLURM_PROCID=2", False, None),
        ("LOCAL_RANK=1", False, None),  # a worker Lightning started
        ("LOCAL_RANK=0 NODE_RANK=1", False, None),
        ("SLURM_JOB_ID=12", True, None),  # an allocation, but not a task started by srun or sbatch
        ("SLURM_JOB_ID=12 SLURM_NTASKS=2 SLURM_JOB_NAME=train", True, "12"),
        ("SLURM_JOB_ID=12 SLURM_NTASKS=2 SLURM_JOB_NAME=interactive", True, None),
        ("SLURM_JOB_ID=13 SLURM_NTASKS=1 SLURM_ARRAY_JOB_ID=12 SLURM_ARRAY_TASK_ID=1", True, "12_1"),
    ],
)
def test_the_environment_says_the_rank_and_the_slurm_job(monkeypatch, tmp_path: Path, env, rank_zero, job_id):
    for name in [
        name for name in os.environ if name.startswith(("SLURM_", "RANK", "LOCAL_RANK", "NODE_RANK"))
    ]:
        monkeypatch.delenv(name)
    for name, value in variables(env).items():
        monkeypatch.setenv(name, value)
    assert environment.is_global_rank_zero() is rank_zero
    assert environment.slurm_job_id() == job_id and SLURMEnvironment.detect() is (job_id is not None)
    if job_id is not None:  # Lightning's SLURM job: its run dir is named after it, so a requeue finds it
        assert environment.run_dir_name("runs") == f"slurm-{job_id}"
    # Ranks other than zero write no config snapshot and no log file into the run dir they share.
    hydra_cfg = api.compose("train", [f"hydra.runtime.output_dir={tmp_path}"]).hydra
    assert (hydra_cfg.output_subdir, list(hydra_cfg.job_logging.root.handlers)) == (
        (".hydra", ["console", "file"]) if rank_zero else (None, ["console"])
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run the script itself")
@pytest.mark.slow  # a process that imports torch
def test_gpu_smoke_script_says_it_needs_a_gpu():
    script, env = ROOT / "scripts" / "gpu_smoke.sh", {**os.environ, "PY": sys.executable}
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stdout.startswith("FAIL  no CUDA GPU is visible")
