"""`trainer.precision=auto` trains in bf16 where the device computes bf16 natively and in 32 elsewhere, saying
which and why; a run that asks for bf16 on a CPU that emulates it keeps it, with one warning. The machines are
written down as `Device`s, so these tests mean the same on any CPU."""

import json
import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src.run.hardware import Device, cpu_model_and_flags, fit_precision, native_bf16
from src.tasks import train
from tests.conftest import ONE_BATCH

AVX2 = Device("cpu", "AMD EPYC 7B13", cpu_capability="AVX2", cpu_flags=frozenset({"avx", "avx2", "fma"}))
AVX512 = Device(
    "cpu", "Intel Xeon Gold 6148", cpu_capability="AVX512", cpu_flags=frozenset({"avx2", "avx512f"})
)
AVX512_BF16 = Device(
    "cpu", "AMD EPYC 9B14", cpu_capability="AVX512", cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16"})
)
AMX = Device("cpu", "Intel Xeon 8481C", cpu_capability="AVX512", cpu_flags=frozenset({"avx512f", "amx_bf16"}))
# ATEN_CPU_CAPABILITY=avx2 on a CPU with AVX-512 BF16: torch's kernels then emulate bf16 like an AVX2 CPU's.
CAPPED = Device("cpu", "AMD EPYC 9B14", cpu_capability="AVX2", cpu_flags=AVX512_BF16.cpu_flags)
A100 = Device("cuda", "NVIDIA A100-SXM4-80GB", cuda_bf16=True)
V100 = Device("cuda", "Tesla V100-SXM2-16GB", cuda_bf16=False)
APPLE = Device("mps", "Apple GPU")

AUTO_CHOICES = [
    (AVX2, 32, "this CPU (AMD EPYC 7B13) has no AVX-512 BF16 or AMX and emulates bf16"),
    (AVX512, 32, "this CPU (Intel Xeon Gold 6148) has no AVX-512 BF16 or AMX and emulates bf16"),
    (AVX512_BF16, "bf16-mixed", "this CPU (AMD EPYC 9B14) computes bf16 natively: AVX-512 BF16"),
    (AMX, "bf16-mixed", "this CPU (Intel Xeon 8481C) computes bf16 natively: AMX"),
    (CAPPED, 32, "torch's CPU kernels use AVX2 here, which emulates bf16"),
    (A100, "bf16-mixed", "NVIDIA A100-SXM4-80GB computes bf16 natively"),
    (V100, 32, "Tesla V100-SXM2-16GB has no bf16 arithmetic (CUDA GPUs have it from Ampere on)"),
    (APPLE, 32, "on Apple GPUs bf16 saves memory but not time"),
]


@pytest.mark.parametrize(("device", "chosen", "why"), AUTO_CHOICES)
def test_auto_precision_follows_the_device_and_says_why_in_one_line(device, chosen, why, caplog):
    trainer = OmegaConf.create({"precision": "auto"})
    with caplog.at_level(logging.INFO, logger="src.run.hardware"):
        fit_precision(trainer, device)
    assert trainer.precision == chosen
    assert caplog.messages == [f"trainer.precision=auto: {chosen} ({why})"]


@pytest.mark.parametrize("asked", ["bf16-mixed", "bf16-true"])
def test_bf16_asked_for_on_a_cpu_that_emulates_it_is_kept_with_one_warning(asked: str, caplog):
    trainer = OmegaConf.create({"precision": asked})
    fit_precision(trainer, AVX2)
    assert trainer.precision == asked  # the user's choice
    assert [(record.levelname, record.message) for record in caplog.records] == [
        (
            "WARNING",
            f"trainer.precision={asked}: this CPU (AMD EPYC 7B13) has no AVX-512 BF16 or AMX and emulates bf16, "
            "about 10x slower than 32; trainer.precision=auto or trainer.precision=32 avoids it",
        )
    ]


@pytest.mark.parametrize(
    ("precision", "device"),
    [("bf16-mixed", AVX512_BF16), ("bf16-mixed", A100), ("bf16-mixed", V100), (32, AVX2), ("64", AVX2)],
)
def test_a_precision_the_device_runs_at_full_speed_gets_no_word(precision, device: Device, caplog):
    trainer = OmegaConf.create({"precision": precision})
    with caplog.at_level(logging.INFO, logger="src.run.hardware"):
        fit_precision(trainer, device)
    assert trainer.precision == precision
    assert caplog.messages == []


def test_the_cpu_flags_are_those_of_the_first_processor(tmp_path: Path):
    cpuinfo = tmp_path / "cpuinfo"
    first = "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    cpuinfo.write_text(f"{first}\nprocessor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
    assert cpu_model_and_flags(cpuinfo) == (
        "AMD EPYC 9B14",
        frozenset({"fpu", "avx2", "avx512f", "avx512_bf16"}),
    )
    assert cpu_model_and_flags(tmp_path / "missing") == ("CPU", frozenset())  # macOS, Windows


def test_a_run_trains_in_the_precision_this_machine_computes_fast(compose_cfg, caplog):
    """`python src/train.py trainer.precision=auto` trains here in bf16-mixed on a CPU with AVX-512 BF16 or AMX,
    in 32 on others; the run record keeps the precision used, which `eval run_dir=` tests in."""
    chosen = "bf16-mixed" if native_bf16(Device.detect("cpu"))[0] else 32
    cfg = compose_cfg("train", ["data=digits", "model/net=mlp", "trainer.precision=auto", *ONE_BATCH])
    with caplog.at_level(logging.INFO, logger="src.run.hardware"):
        train(cfg)
    said = [record.getMessage() for record in caplog.records if record.name == "src.run.hardware"]
    assert [message.split(" (")[0] for message in said] == [f"trainer.precision=auto: {chosen}"]
    record = json.loads((Path(cfg.paths.output_dir) / "run.json").read_text())
    assert record["config"]["trainer"]["precision"] == chosen
