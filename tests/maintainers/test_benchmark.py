"""The template's benchmarks (scripts/benchmark.py, scripts/benchmark_streaming.py) in their tiny mode: each runs
end to end and reports every figure; and the malloc setting they measure (extras.keep_freed_memory). Speed
itself is never asserted here: the scripts print ratios measured in one run."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch

from src.run import memory
from tests.conftest import ROOT

GLIBC = memory.glibc()

SIDES = ("template", "lightning", "classic", "tight", "classic_untuned")
STEP_FIELDS = [f"{side}_{rate}_samples_per_sec" for side in SIDES for rate in ("train", "fit")] + [
    f"ratio_{rate}_vs_{base}" for rate in ("train", "fit") for base in SIDES[1:]
]
STARTUP_FIELDS = ["import_floor_s", "debug_fdr_s", "help_s", "cfg_job_s", "debug_fdr_over_floor_s"]
DATA_FIELDS = [
    "model_steps_per_sec",
    "loader_batches_batches_per_sec",
    "loader_samples_batches_per_sec",
    "loader_batches_over_model",
    "loader_samples_over_model",
]


def benchmark(*args: str, timeout: int) -> subprocess.CompletedProcess:
    """`python scripts/benchmark.py <args>`, as a user runs it."""
    command = [sys.executable, "scripts/benchmark.py", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.matrix  # a maintainers' check: make test-parts (CI) runs it  [part: template]
def test_the_benchmark_runs_in_tiny_mode_and_writes_every_figure(tmp_path: Path):
    output = tmp_path / "bench.json"
    result = benchmark("--tiny", "--cases", "mlp", "--output", str(output), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Template vs hand-written PyTorch" in result.stdout and str(output) in result.stdout

    figures = json.loads(output.read_text())
    assert figures["settings"]["tiny"] is True and figures["machine"]["torch"] == torch.__version__
    steps = figures["step_throughput"]["mlp"]
    assert all(steps[field] > 0 for field in STEP_FIELDS), steps
    assert steps["ratio_train_vs_classic"] == pytest.approx(
        steps["template_train_samples_per_sec"] / steps["classic_train_samples_per_sec"]
    )
    assert isinstance(steps["goal_met"], bool)
    assert steps["template_page_faults"] > 0 and all(steps[f"{side}_page_faults"] >= 0 for side in SIDES)
    assert all(figures["startup"][field] > 0 for field in STARTUP_FIELDS if field != "debug_fdr_over_floor_s")
    assert all(figures["data_path"]["mlp"][field] > 0 for field in DATA_FIELDS)


@pytest.mark.slow
@pytest.mark.matrix  # a maintainers' check: make test-parts (CI) runs it
def test_the_streaming_benchmark_runs_in_tiny_mode_and_stops_its_s3_server(tmp_path: Path):
    """scripts/benchmark_streaming.py (make bench) end to end on 300 digits: every figure, the first epoch from
    the S3 server fetching the chunks and the second reading them from the cache, and the server gone after.
    Speed itself is never asserted: the script prints ratios measured in one run."""
    output = tmp_path / "bench.json"
    command = [sys.executable, "scripts/benchmark_streaming.py", "--tiny", "--output", str(output)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Training loader alone" in result.stdout and str(output) in result.stdout

    figures = json.loads(output.read_text())
    settings, rates = figures["settings"], figures["samples_per_sec"]
    assert settings["tiny"] and settings["train_samples"] == 216 and settings["train_chunks"] > 1
    s3 = {"s3_first_epoch", "s3_second_epoch", "s3_raw_first", "s3_raw_second"}
    assert set(rates) == {"folder", "shards", *s3}
    assert all(rate > 0 for rate in rates.values())
    assert figures["shards_over_folder"] == pytest.approx(rates["shards"] / rates["folder"])
    downloads = figures["chunk_downloads"]
    assert downloads["s3_first_epoch"][0] >= settings["train_chunks"] and downloads["s3_second_epoch"] == [0]
    with pytest.raises(ConnectionRefusedError):  # the server was stopped
        socket.create_connection(("127.0.0.1", urlparse(settings["s3_endpoint"]).port), timeout=5)


def test_a_benchmark_case_that_does_not_exist_is_refused():
    result = benchmark("--cases", "mlp,resnet", timeout=60)
    assert result.returncode == 2
    assert "--cases: resnet is not a case; choose from mlp, cnn" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the cuda variant runs")
def test_the_gpu_variant_without_a_gpu_says_so():
    result = benchmark("--device", "cuda", "--tiny", timeout=120)
    assert result.returncode == 2
    assert "--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is False)" in result.stderr


# A training step's pattern: several big buffers allocated, used and freed together. In a fresh process
# glibc hands them back to the OS on free, and the next step page-faults them all in again. (Only the extras
# case imports what a run imports, Lightning and torch: 4 s; the others need the malloc setting alone.)
STEP_PATTERN = """
import resource, sys
from src.run.memory import keep_freed_memory
if sys.argv[1] == "extras":  # the shipped extras config, as every run applies it
    import lightning  # every training run has imported it before its extras
    from omegaconf import OmegaConf
    from src.run.extras import apply_extras
    extras = OmegaConf.load("configs/extras/default.yaml")
    extras.print_config = False
    apply_extras(OmegaConf.create({"extras": extras, "tags": ["test"]}))
print(keep_freed_memory() if sys.argv[1] == "keep" else False)
def step():
    buffers = [b"x" * (4 << 20) for _ in range(4)]
    del buffers
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str, **env: str) -> tuple[bool, int]:
    """Whether keep_freed_memory applied, and the page faults of 20 steps, in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", STEP_PATTERN, mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    applied, faults = done.stdout.split()
    return applied == "True", int(faults)


@pytest.mark.skipif(not GLIBC, reason="malloc's thresholds are a glibc setting")
@pytest.mark.slow
def test_keep_freed_memory_stops_steps_from_page_faulting_their_buffers_back():
    applied, faults = page_faults("default")
    assert not applied and faults > 20_000  # 16 MiB a step: up to 4096 pages of 4 KiB, every step
    applied, faults = page_faults("keep")
    assert applied and faults < 100
    assert page_faults("extras")[1] < 100  # on by default: extras.keep_freed_memory=true


@pytest.mark.skipif(not GLIBC, reason="malloc's thresholds are a glibc setting")
@pytest.mark.slow
def test_a_users_own_malloc_settings_are_left_alone():
    applied, faults = page_faults("keep", MALLOC_TRIM_THRESHOLD_="65536")
    assert not applied and faults > 10_000
