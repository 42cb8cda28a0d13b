"""Trainer and launch settings that cannot work are refused before anything is built, in one clear line."""

from pathlib import Path

import pytest
import torch

from src.run import preflight
from tests.conftest import run_cli


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend this machine has one CUDA GPU (only the checks look at it; nothing runs on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def check(compose_cfg, *overrides: str) -> None:
    preflight.check_run(compose_cfg("train", list(overrides)))


@pytest.mark.parametrize("precision", ["32", "32-true", "bf16-mixed", "bf16-true", "16-true", "64", "bf16"])
def test_cpu_precisions_pass(compose_cfg, no_gpu, precision):
    check(compose_cfg, "trainer=cpu", f"trainer.precision={precision}")


def test_an_unknown_precision_lists_the_valid_ones(compose_cfg):
    with pytest.raises(
        ValueError, match=r"trainer.precision=17 is not valid: expected one of .*16-mixed.*bf16-mixed"
    ):
        check(compose_cfg, "trainer.precision=17")


def test_fp16_autocast_on_the_cpu_is_refused_not_silently_swapped(compose_cfg, no_gpu):
    with pytest.raises(
        ValueError, match=r"trainer.precision=16-mixed needs a CUDA GPU .* use bf16-mixed, bf16-true or 32"
    ):
        check(compose_cfg, "trainer=cpu", "trainer.precision=16-mixed")
    with pytest.raises(ValueError, match=r"trainer.precision=16 needs a CUDA GPU"):  # the legacy alias
        check(compose_cfg, "trainer.accelerator=auto", "trainer.precision=16")


def test_fp16_autocast_passes_on_a_gpu(compose_cfg, one_gpu):
    check(compose_cfg, "trainer=gpu", "trainer.precision=16-mixed")
    check(compose_cfg, "trainer=ddp", "trainer.devices=-1")  # all GPUs there are; too many: Lightning says so


@pytest.mark.parametrize("preset", ["fsdp", "deepspeed"])
def test_gpu_only_strategies_are_refused_without_a_gpu(compose_cfg, no_gpu, preset):
    with pytest.raises(
        ValueError, match=rf"trainer={preset} .* needs CUDA GPUs, but no CUDA GPU is visible here"
    ):
        check(compose_cfg, f"trainer={preset}")


def test_fsdp_on_the_cpu_accelerator_is_refused_even_with_a_gpu(compose_cfg, one_gpu):
    with pytest.raises(
        ValueError, match=r"trainer=fsdp .* but this run uses accelerator=cpu; .* trainer=ddp_sim"
    ):
        check(compose_cfg, "trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=1")


def test_fsdp_passes_on_a_gpu(compose_cfg, one_gpu):
    check(compose_cfg, "trainer=fsdp", "trainer.devices=1", "trainer.precision=bf16-mixed")


def test_a_gpu_trainer_without_a_gpu_says_what_to_use(compose_cfg, no_gpu):
    with pytest.raises(
        ValueError,
        match=r"trainer.accelerator=gpu needs a CUDA GPU, but none is visible here; use trainer=cpu, or trainer=ddp_sim",
    ):
        check(compose_cfg, "trainer=ddp")


def test_more_gpus_than_the_machine_has_are_refused(compose_cfg, one_gpu):
    with pytest.raises(
        ValueError,
        match=r"trainer.devices=4 asks for 4 GPUs, but this machine has 1; choose trainer.devices=1",
    ):
        check(compose_cfg, "trainer=ddp", "trainer.devices=4")
    with pytest.raises(ValueError, match=r"trainer.devices=\[0, 2\] names GPU 2, but this machine has 1"):
        check(compose_cfg, "trainer=ddp", "trainer.devices=[0,2]")


def test_more_cpu_processes_than_cores_are_allowed(compose_cfg, no_gpu):
    check(compose_cfg, "trainer=ddp_sim", "trainer.devices=8")  # slow, but a valid way to simulate 8 ranks


def test_a_sweep_started_by_torchrun_is_refused(compose_cfg, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        RuntimeError, match=r"started by torchrun or srun as 2 processes, and each would run the whole sweep"
    ):
        check(compose_cfg, "hydra.mode=MULTIRUN")
    check(compose_cfg)  # a single run under torchrun is what torchrun is for


def test_a_sweep_inside_a_multi_task_slurm_step_is_refused(compose_cfg, monkeypatch):
    for name, value in {"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "7"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(
        RuntimeError, match=r"as 4 processes, .* a launcher that submits one cluster job per job"
    ):
        check(compose_cfg, "hydra.mode=MULTIRUN")
    # part: cluster
    check(compose_cfg, "hydra.mode=MULTIRUN", "hydra/launcher=submitit_slurm")  # its tasks are jobs
    # /part


def test_a_bad_combination_fails_in_one_line_before_training(tmp_path: Path, data_dir: Path):
    result = run_cli(
        "train", "trainer=cpu", "trainer.precision=16-mixed", log_dir=tmp_path, data_dir=data_dir
    )
    assert result.returncode != 0
    assert "trainer.precision=16-mixed needs a CUDA GPU" in result.stderr
    assert "site-packages/lightning" not in result.stderr  # refused before Lightning was involved
    assert not list(tmp_path.glob("train/runs/*/checkpoints"))  # nothing was trained


def test_float64_on_apple_silicon_is_refused(compose_cfg):
    with pytest.raises(ValueError, match=r"trainer.precision=64: MPS has no float64; use 32 or bf16-mixed"):
        check(compose_cfg, "trainer=mps", "trainer.precision=64")
