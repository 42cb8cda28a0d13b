"""The benchmark script (scripts/benchmark.py) in its tiny mode: it runs end to end and reports every figure.
Speed itself is never asserted here: the script prints ratios measured in one run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

STEP_FIELDS = [
    f"{side}_{rate}_samples_per_sec"
    for side in ("template", "lightning", "classic", "tight")
    for rate in ("train", "fit")
] + [f"ratio_{rate}_vs_{base}" for rate in ("train", "fit") for base in ("lightning", "classic", "tight")]
STARTUP_FIELDS = ["import_floor_s", "debug_fdr_s", "help_s", "cfg_job_s", "debug_fdr_over_floor_s"]
DATA_FIELDS = [
    "model_steps_per_sec",
    "loader_batches_batches_per_sec",
    "loader_samples_batches_per_sec",
    "loader_batches_over_model",
    "loader_samples_over_model",
]


def test_the_benchmark_runs_in_tiny_mode_and_writes_every_figure(tmp_path: Path):
    output = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "scripts/benchmark.py", "--tiny", "--cases", "mlp", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
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
    assert all(figures["startup"][field] > 0 for field in STARTUP_FIELDS if field != "debug_fdr_over_floor_s")
    assert all(figures["data_path"]["mlp"][field] > 0 for field in DATA_FIELDS)


def test_a_benchmark_case_that_does_not_exist_is_refused():
    result = subprocess.run(
        [sys.executable, "scripts/benchmark.py", "--cases", "mlp,resnet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--cases: resnet is not a case; choose from mlp, cnn" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the cuda variant runs")
def test_the_gpu_variant_without_a_gpu_says_so():
    result = subprocess.run(
        [sys.executable, "scripts/benchmark.py", "--device", "cuda", "--tiny"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is False)" in result.stderr
