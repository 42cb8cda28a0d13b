"""Trainer and launch settings that cannot work are refused before anything is built, in one clear line."""

import pytest
import torch

from src.run import preflight

# What is refused on a machine without a CUDA GPU: the overrides, and what the error must say.
REFUSED_WITHOUT_A_GPU = {
    "trainer.precision=17": r"trainer.precision=17 is not valid: expected one of .*16-mixed.*bf16-mixed",
    # fp16 autocast on the CPU is refused, not silently swapped; also as its legacy alias 16
    "trainer=cpu trainer.precision=16-mixed": (
        r"trainer.precision=16-mixed needs a CUDA GPU .* use bf16-mixed, bf16-true or 32"
    ),
    "trainer.accelerator=auto trainer.precision=16": r"trainer.precision=16 needs a CUDA GPU",
    "trainer=fsdp": r"trainer=fsdp .* needs CUDA GPUs, but no CUDA GPU is visible here",
    "trainer=deepspeed": r"trainer=deepspeed .* needs CUDA GPUs, but no CUDA GPU is visible here",
    "trainer=ddp": (
        r"trainer.accelerator=gpu needs a CUDA GPU, but none is visible here; use trainer=cpu, or trainer=ddp_sim"
    ),
    "trainer=mps trainer.precision=64": r"trainer.precision=64: MPS has no float64; use 32 or bf16-mixed",
}
# ... and on a machine with one.
REFUSED_WITH_ONE_GPU = {
    "trainer=fsdp trainer.accelerator=cpu trainer.devices=1": (
        r"trainer=fsdp .* but this run uses accelerator=cpu; .* trainer=ddp_sim"
    ),
    "trainer=ddp trainer.devices=4": (
        r"trainer.devices=4 asks for 4 GPUs, but this machine has 1; choose trainer.devices=1"
    ),
    "trainer=ddp trainer.devices=[0,2]": r"trainer.devices=\[0, 2\] names GPU 2, but this machine has 1",
}
CPU_PRECISIONS = ["32", "32-true", "bf16-mixed", "bf16-true", "16-true", "64", "bf16"]
PASSES = [  # (CUDA GPUs, overrides)
    *((0, f"trainer=cpu trainer.precision={precision}") for precision in CPU_PRECISIONS),
    (0, "trainer=ddp_sim trainer.devices=8"),  # more processes than cores: slow, but valid
    (1, "trainer=gpu trainer.precision=16-mixed"),
    (1, "trainer=ddp trainer.devices=-1"),  # all GPUs there are
    (1, "trainer=fsdp trainer.devices=1 trainer.precision=bf16-mixed"),
]


def check(compose_cfg, overrides: str) -> None:
    preflight.check_run(compose_cfg("train", overrides.split()))


def pretend_gpus(monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:  # only the checks look at them
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)


@pytest.mark.parametrize(("overrides", "says"), REFUSED_WITHOUT_A_GPU.items())
def test_what_cannot_work_without_a_gpu_is_refused(compose_cfg, monkeypatch, overrides: str, says: str):
    pretend_gpus(monkeypatch, 0)
    with pytest.raises(ValueError, match=says):
        check(compose_cfg, overrides)


@pytest.mark.parametrize(("overrides", "says"), REFUSED_WITH_ONE_GPU.items())
def test_what_cannot_work_with_one_gpu_is_refused(compose_cfg, monkeypatch, overrides: str, says: str):
    pretend_gpus(monkeypatch, 1)
    with pytest.raises(ValueError, match=says):
        check(compose_cfg, overrides)


@pytest.mark.parametrize(("gpus", "overrides"), PASSES)
def test_what_can_work_passes(compose_cfg, monkeypatch, gpus: int, overrides: str):
    pretend_gpus(monkeypatch, gpus)
    check(compose_cfg, overrides)


def test_a_sweep_started_by_torchrun_is_refused(compose_cfg, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("WORLD_SIZE", "2")
    each = r"started by torchrun or srun as 2 processes, and each would run the whole sweep"
    with pytest.raises(RuntimeError, match=each):
        check(compose_cfg, "hydra.mode=MULTIRUN")
    check(compose_cfg, "")  # a single run under torchrun is what torchrun is for


def test_a_sweep_inside_a_multi_task_slurm_step_is_refused(compose_cfg, monkeypatch):
    for name, value in {"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "7"}.items():
        monkeypatch.setenv(name, value)
    one_job_per_job = r"as 4 processes, .* a launcher that submits one cluster job per job"
    with pytest.raises(RuntimeError, match=one_job_per_job):
        check(compose_cfg, "hydra.mode=MULTIRUN")
    # part: cluster
    check(compose_cfg, "hydra.mode=MULTIRUN hydra/launcher=submitit_slurm")  # its tasks are jobs
    # /part
