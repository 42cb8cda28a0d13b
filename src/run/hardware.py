"""The device a run computes on and what it computes fast: `trainer.precision=auto` becomes bf16 mixed precision
where the device has bf16 arithmetic and 32 where bf16 would be emulated, and a run that asks for bf16 on a CPU
that emulates it is warned once, before anything is instantiated.

torch says whether a CUDA GPU has bf16 (`torch.cuda.is_bf16_supported`) and which vector unit its CPU kernels
use (`torch.backends.cpu.get_cpu_capability`), but whether a CPU has bf16 instructions only through private
functions: that is read here from the CPU flags the Linux kernel lists in /proc/cpuinfo (on other systems no
flag is known, and `auto` picks 32 on their CPUs).
"""

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from src.common.config_names import resolved_accelerator
from src.launch import environment

log = logging.getLogger(__name__)

# The CPU flags (/proc/cpuinfo) of instructions that compute in bf16: AVX-512 BF16 (Intel since Cooper Lake,
# AMD since Zen 4) and AMX (Intel since Sapphire Rapids). Without them oneDNN emulates bf16 in float32.
CPU_BF16_FLAGS = {"avx512_bf16": "AVX-512 BF16", "amx_bf16": "AMX"}
# How much slower bf16 is where it is emulated: a small U-Net's training step with AVX2 kernels (9.5x
# and 11.5x against float32; on a CPU with AVX-512 BF16 the same step ran 1.8x faster in bf16).
EMULATED_SLOWDOWN = "about 10x"


@dataclass(frozen=True)
class Device:
    """What decides whether a device computes bf16 natively (`native_bf16`'s inputs): `detect` reads them from
    this machine; a test writes them down for the machine it means."""

    kind: str  # cuda, mps or cpu
    name: str  # the GPU's or the CPU's model, for the log line
    cuda_bf16: bool = False  # a CUDA GPU with bf16 arithmetic (Ampere or newer)
    cpu_capability: str = "DEFAULT"  # the vector unit of torch's CPU kernels: AVX512, AVX2, ...
    cpu_flags: frozenset[str] = frozenset()  # the CPU's flags, as /proc/cpuinfo lists them

    @classmethod
    def detect(cls, accelerator: Any) -> "Device":
        kind = resolved_accelerator(accelerator)
        if kind == "cuda" and not torch.cuda.is_available():  # preflight refuses the run, naming the key
            return cls(kind, "no CUDA GPU")
        if kind == "cuda":
            name = torch.cuda.get_device_name()
            return cls(kind, name, cuda_bf16=torch.cuda.is_bf16_supported(including_emulation=False))
        if kind == "mps":
            return cls(kind, "Apple GPU")
        name, flags = cpu_model_and_flags()
        return cls(kind, name, cpu_capability=torch.backends.cpu.get_cpu_capability(), cpu_flags=flags)


def cpu_model_and_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags as /proc/cpuinfo lists them for its first processor; ("CPU", none) where
    there is no such file (macOS, Windows)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return "CPU", frozenset()
    model, flags = (re.search(rf"^{key}\s*:\s*(.*)$", text, re.MULTILINE) for key in ("model name", "flags"))
    return model[1] if model else "CPU", frozenset(flags[1].split() if flags else ())


def native_bf16(device: Device) -> tuple[bool, str]:
    """Whether `device` computes bf16 natively, and why, in words for a log line."""
    if device.kind == "cuda":
        if device.cuda_bf16:
            return True, f"{device.name} computes bf16 natively"
        return False, f"{device.name} has no bf16 arithmetic (CUDA GPUs have it from Ampere on)"
    if device.kind == "mps":
        return False, "on Apple GPUs bf16 saves memory but not time"
    found = [label for flag, label in CPU_BF16_FLAGS.items() if flag in device.cpu_flags]
    if found and device.cpu_capability.startswith("AVX512"):
        return True, f"this CPU ({device.name}) computes bf16 natively: {' and '.join(found)}"
    if found:  # ATEN_CPU_CAPABILITY set lower than the CPU's
        return False, f"torch's CPU kernels use {device.cpu_capability} here, which emulates bf16"
    return False, f"this CPU ({device.name}) has no AVX-512 BF16 or AMX and emulates bf16"


def fit_precision(trainer: DictConfig, device: Device | None = None) -> None:
    """Replace `trainer.precision=auto` with bf16-mixed or 32 for the device the run uses, saying which and why
    in one line; one warning when the run asks for bf16 on a CPU that emulates it (the run keeps it)."""
    precision = str(trainer.get("precision"))
    if precision != "auto" and not precision.startswith("bf16"):
        return
    device = device or Device.detect(trainer.get("accelerator", "auto"))
    native, why = native_bf16(device)
    speaks = environment.is_global_rank_zero()
    if precision == "auto":
        trainer.precision = "bf16-mixed" if native else 32
        if speaks:
            log.info(f"trainer.precision=auto: {trainer.precision} ({why})")
    elif device.kind == "cpu" and not native and speaks:
        log.warning(
            f"trainer.precision={precision}: {why}, {EMULATED_SLOWDOWN} slower than 32; "
            "trainer.precision=auto or trainer.precision=32 avoids it"
        )
