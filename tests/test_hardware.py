"""`trainer.precision=auto` trains in bf16 where the device computes it natively, else in 32, saying which and
why; bf16 asked for on a CPU that emulates it is kept, with a warning. The machines are written down as
`Device`s, so these tests mean the same on any CPU."""

import json
import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src import api
from src.run.hardware import Device, cpu_model_and_flags, fit_precision, native_bf16
from tests.conftest import ONE_BATCH

AVX2 = Device("cpu", "AMD EPYC 7B13", cpu_capability="AVX2", cpu_flags=frozenset({"avx", "avx2", "fma"}))
AVX512 = Device("cpu", "Intel Xeon Gold 6148", cpu_capability="AVX512", cpu_flags=frozenset({"avx512f"}))
AVX512_BF16 = Device("cpu", "AMD EPYC 9B14", cpu_capability="AVX512", cpu_flags=frozenset({"avx512_bf16"}))
AMX = Device("cpu", "Intel Xeon 8481C", cpu_capability="AVX512", cpu_flags=frozenset({"avx512f", "amx_bf16"}))
# ATEN_CPU_CAPABILITY=avx2 on a CPU with AVX-512 BF16: torch's kernels then emulate bf16 like an AVX2 CPU's.
CAPPED = Device("cpu", "AMD EPYC 9B14", cpu_capability="AVX2", cpu_flags=AVX512_BF16.cpu_flags)
A100 = Device("cuda", "NVIDIA A100-SXM4-80GB", cuda_bf16=True)
V100 = Device("cuda", "Tesla V100-SXM2-16GB", cuda_bf16=False)
APPLE = Device("mps", "Apple GPU")
SLOW = (
    "this CPU (AMD EPYC 7B13) has no AVX-512 BF16 or AMX and emulates bf16, about 10x slower than 32; "
    "trainer.precision=auto or trainer.precision=32 avoids it"
)
# trainer.precision asked for, the device, the precision the run uses, and why (auto: an info line; bf16 on a
# CPU that emulates it: a warning; None: not a word).
CASES = [
    ("auto", AVX2, 32, "this CPU (AMD EPYC 7B13) has no AVX-512 BF16 or AMX and emulates bf16"),
    ("auto", AVX512, 32, "this CPU (Intel Xeon Gold 6148) has no AVX-512 BF16 or AMX and emulates bf16"),
    ("auto", AVX512_BF16, "bf16-mixed", "this CPU (AMD EPYC 9B14) computes bf16 natively: AVX-512 BF16"),
    ("auto", AMX, "bf16-mixed", "this CPU (Intel Xeon 8481C) computes bf16 natively: AMX"),
    ("auto", CAPPED, 32, "torch's CPU kernels use AVX2 here, which emulates bf16"),
    ("auto", A100, "bf16-mixed", "NVIDIA A100-SXM4-80GB computes bf16 natively"),
    ("auto", V100, 32, "Tesla V100-SXM2-16GB has no bf16 arithmetic (CUDA GPUs have it from Ampere on)"),
    ("auto", APPLE, 32, "on Apple GPUs bf16 saves memory but not time"),
    ("bf16-mixed", AVX2, "bf16-mixed", SLOW),
    ("bf16-true", AVX2, "bf16-true", SLOW),
    ("bf16-mixed", AVX512_BF16, "bf16-mixed", None),
    ("bf16-mixed", A100, "bf16-mixed", None),
    ("bf16-mixed", V100, "bf16-mixed", None),
    (32, AVX2, 32, None),
    ("64", AVX2, "64", None),
]


@pytest.mark.parametrize(("asked", "device", "used", "why"), CASES)
def test_the_precision_fits_the_device_and_the_run_says_why_in_one_line(asked, device, used, why, caplog):
    trainer = OmegaConf.create({"precision": asked})
    with caplog.at_level(logging.INFO, logger="src.run.hardware"):
        fit_precision(trainer, device)
    assert trainer.precision == used
    level, line = ("INFO", f"{used} ({why})") if asked == "auto" else ("WARNING", why)
    said = [f"{level} trainer.precision={asked}: {line}"] if why else []
    assert [f"{record.levelname} {record.message}" for record in caplog.records] == said


def test_the_cpu_flags_are_those_of_the_first_processor(tmp_path: Path):
    cpuinfo = tmp_path / "cpuinfo"
    flags = {"fpu", "avx2", "avx512f", "avx512_bf16"}
    first = f"processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: {' '.join(flags)}\n"
    cpuinfo.write_text(f"{first}\nprocessor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
    assert cpu_model_and_flags(cpuinfo) == ("AMD EPYC 9B14", frozenset(flags))
    assert cpu_model_and_flags(tmp_path / "missing") == ("CPU", frozenset())  # macOS, Windows


def test_a_run_trains_in_the_precision_this_machine_computes_fast(here: list[str]):
    """bf16-mixed on a CPU with AVX-512 BF16 or AMX, 32 on others; the run record keeps the precision used,
    which `eval run_dir=` tests in."""
    chosen = "bf16-mixed" if native_bf16(Device.detect("cpu"))[0] else 32
    run = api.train([*here, "data=digits", "model/net=mlp", "trainer.precision=auto", *ONE_BATCH])
    assert (run.run_dir / "train.log").read_text().count(f"trainer.precision=auto: {chosen} (") == 1
    assert json.loads((run.run_dir / "run.json").read_text())["config"]["trainer"]["precision"] == chosen
