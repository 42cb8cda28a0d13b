"""A trained run served over HTTP (`python src/serve.py`): the same answers as predict, with batching off and
on; bad requests refused with a 4xx and a reason, the server answering on; SIGTERM and Ctrl-C stopping it
and every process it started."""

import base64
import io
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np  # [part: segmentation]
import pytest
import requests
from PIL import Image

from src import api
from src.inference.serving import answers_for
from src.models.task_module import TaskModule
from tests.conftest import ROOT, free_port, start_cli

# Seconds until /health answers: LitServe starts its processes and each loads the model (4 s on an idle machine).
STARTUP_TIMEOUT = 120


def encoded(path_or_bytes: Path | bytes) -> dict[str, str]:
    data = path_or_bytes.read_bytes() if isinstance(path_or_bytes, Path) else path_or_bytes
    return {"image": base64.b64encode(data).decode("ascii")}


def processes_under(pid: int) -> set[int]:
    """The processes started by `pid`, and by those, as /proc lists them now."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        children = {child for child, ppid in parents.items() if ppid == parent}
        found |= children
        todo += children
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Server:
    """`python src/serve.py ...` started as a user starts it, on a free port; stopped by a signal."""

    def __init__(self, tmp_path: Path, data_dir: Path, *overrides: str) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.output = tmp_path / "serve.out"
        port = self.url.rsplit(":", 1)[1]
        self.process = start_cli(
            "serve", *overrides, f"port={port}", "accelerator=cpu", "log_level=warning",
            log_dir=tmp_path, data_dir=data_dir, output=self.output,
        )  # fmt: skip
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self.healthy():
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, f"not healthy in {STARTUP_TIMEOUT} s\n{self.log()}"
            time.sleep(0.2)
        self.children = processes_under(self.process.pid)

    def healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/health", timeout=5).status_code == 200
        except requests.ConnectionError:
            return False

    def log(self) -> str:
        return self.output.read_text()[-3000:] + Path(f"{self.output}.err").read_text()[-3000:]

    def predict(self, **request) -> requests.Response:
        return requests.post(f"{self.url}/predict", timeout=60, **request)

    def stop(self, signal_number: int) -> float:
        """Send the signal; the seconds until the server and every process it started have ended."""
        start = time.monotonic()
        self.process.send_signal(signal_number)
        try:
            assert self.process.wait(timeout=60) == 0, self.log()
            while any(running(pid) for pid in self.children):
                assert time.monotonic() - start < 30, (
                    f"left running: {[p for p in self.children if running(p)]}"
                )
                time.sleep(0.1)
        except BaseException:  # the test fails, but no process of the server's outlives it
            for pid in filter(running, self.children):
                os.kill(pid, signal.SIGKILL)
            raise
        return time.monotonic() - start


def predicted(digits_run: Path, digit_files: Path, here_for_inference: list[str]) -> dict[str, dict]:
    """predict's rows for the digit files, by file name."""
    run = api.predict([*here_for_inference, f"run_dir={digits_run}", f"inputs={digit_files}", "top_k=10"])
    rows = json.loads((run.run_dir / "predictions.json").read_text())
    return {Path(row["file"]).name: row for row in rows}


def assert_same_as_predict(answers: dict[str, dict], rows: dict[str, dict]) -> None:
    assert answers.keys() == rows.keys()
    for name, answer in answers.items():
        assert answer["class"] == rows[name]["predicted"], name
        assert answer["class_name"] == rows[name]["predicted_name"], name
        for entry in rows[name]["top_k"]:  # every class (top_k=10), most likely first
            assert answer["probabilities"][entry["class"]] == pytest.approx(entry["probability"], abs=1e-6)


@pytest.mark.slow
def test_served_answers_equal_predicts_and_bad_requests_get_a_4xx_then_sigterm_stops_everything(
    digits_run: Path, digit_files: Path, tmp_path: Path, data_dir: Path, here_for_inference: list[str]
):
    rows = predicted(digits_run, digit_files, here_for_inference)
    server = Server(
        tmp_path, data_dir, f"run_dir={digits_run}", "max_body_bytes=100000", "max_image_pixels=10000"
    )
    try:
        files = sorted(digit_files.iterdir())
        answers = {file.name: server.predict(json=encoded(file)) for file in files}
        assert all(response.status_code == 200 for response in answers.values()), answers
        assert_same_as_predict({name: response.json() for name, response in answers.items()}, rows)

        good = encoded(files[0])
        lab = io.BytesIO()
        Image.new("LAB", (8, 8)).save(lab, format="TIFF")  # PIL cannot make a LAB image grayscale
        large = io.BytesIO()
        Image.new("L", (200, 200)).save(large, format="PNG")
        bad = {
            "not base64": (400, {"json": {"image": "#not base64#"}}, "image: not base64"),
            "not an image": (400, {"json": encoded(b"%PDF-1.4 ...")}, "not an image file"),
            "wrong channels": (400, {"json": encoded(lab.getvalue())}, "a LAB image cannot become L"),
            "too many pixels": (413, {"json": encoded(large.getvalue())}, "over max_image_pixels=10000"),
            "body too large": (413, {"json": {"image": "A" * 200_000}}, "over max_body_bytes=100000"),
            "missing field": (422, {"json": {"picture": good["image"]}}, "body.image: Field required"),
            "not JSON": (422, {"data": b"{image:", "headers": {"Content-Type": "application/json"}}, "JSON"),
            "wrong content type": (415, {"data": b"\x89PNG", "headers": {"Content-Type": "image/png"}}, "image/png"),
            "a pickle": (415, {"data": b"\x80\x04K\x01.", "headers": {"Content-Type": "application/octet-stream"}},
                         "application/octet-stream"),
        }  # fmt: skip
        for what, (status, request, reason) in bad.items():
            response = server.predict(**request)
            assert response.status_code == status, (what, response.text)
            detail = response.json()["detail"]
            assert isinstance(detail, str) and "\n" not in detail and reason in detail, (what, detail)
            assert server.predict(json=good).status_code == 200, what  # it still answers
        assert "Traceback" not in server.log()
    finally:
        seconds = server.stop(signal.SIGTERM)
    assert seconds < 15 and server.children, server.log()
    assert "Traceback" not in server.log()


@pytest.mark.slow
def test_batched_answers_equal_predicts_and_ctrl_c_stops_everything(
    digits_run: Path, digit_files: Path, tmp_path: Path, data_dir: Path, here_for_inference: list[str]
):
    rows = predicted(digits_run, digit_files, here_for_inference)
    overrides = ["max_batch_size=4", "batch_timeout=0.5", "workers=2"]
    server = Server(tmp_path, data_dir, f"run_dir={digits_run}", *overrides)
    try:
        files = sorted(digit_files.iterdir())
        requests_ = [encoded(file) for file in files] + [{"image": "#not base64#"}]  # one bad one among them
        with ThreadPoolExecutor(len(requests_)) as pool:  # at the same time: answered in batches
            responses = list(pool.map(lambda request: server.predict(json=request), requests_))
        assert responses[-1].status_code == 400  # refused alone: the others in its batch are answered
        assert all(response.status_code == 200 for response in responses[:-1]), [r.text for r in responses]
        assert_same_as_predict({file.name: r.json() for file, r in zip(files, responses, strict=False)}, rows)
        # The 2 model processes share the cores, less one for the HTTP process: PyTorch threads each.
        cores = len(os.sched_getaffinity(0))
        assert requests.get(f"{server.url}/info", timeout=5).json()["model"]["cpu_threads"] == max(
            1, (cores - 1) // 2
        )
    finally:
        seconds = server.stop(signal.SIGINT)
    assert seconds < 15 and len(server.children) >= 4, server.log()  # 2 model processes, 2 HTTP ones, ...


def test_a_task_module_that_cannot_serve_says_so_in_one_line():
    class Regressor(TaskModule):
        task = "regression"

    with pytest.raises(ValueError) as refused:
        answers_for(Regressor)
    message = "Regressor (task: regression) cannot be served: serve answers the tasks classification"
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.slow
@pytest.mark.matrix  # a maintainers' check, as the other benchmarks': make test-parts (CI) runs it  [part: template]
def test_the_load_script_reports_both_servers_figures(digits_run: Path, tmp_path: Path):
    output = tmp_path / "load.json"
    command = [sys.executable, "scripts/serve_load.py", "--run-dir", str(digits_run), "--clients", "2"]
    command += ["--seconds", "0.5", "--batch-size", "4", "--output", str(output)]  # as short as it measures
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "batching on / off:" in result.stdout
    figures = json.loads(output.read_text())
    for name, batch_size in (("batching_off", 1), ("batching_on", 4)):
        row = figures[name]
        assert row["max_batch_size"] == batch_size and row["requests"] > 0 and row["errors"] == 0, row
        assert row["requests_per_sec"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"], row
    assert figures["ratio_requests_per_sec"] > 0


# part: segmentation
@pytest.mark.slow
def test_a_served_segmenter_answers_predicts_masks(
    segment_run: Path, tmp_path: Path, data_dir: Path, here_for_inference: list[str]
):
    from hydra.utils import instantiate

    config = json.loads((segment_run / "run.json").read_text())["config"]["data"]
    with np.load(instantiate(config).cache_file) as cached:  # a scene the run was tested on, as uint8
        scene = cached["test_scenes"][0]
    files = tmp_path / "scenes"
    files.mkdir()
    Image.fromarray(scene).save(files / "scene.png")
    Image.fromarray(scene).resize((70, 50)).save(files / "wide.png")  # answered at its own size
    out = api.predict([*here_for_inference, f"run_dir={segment_run}", f"inputs={files}"]).run_dir
    rows = json.loads((out / "predictions.json").read_text())
    server = Server(tmp_path / "serve", data_dir, f"run_dir={segment_run}")
    try:
        for row in rows:
            answer = server.predict(json=encoded(Path(row["file"])))
            assert answer.status_code == 200, answer.text
            served = Image.open(io.BytesIO(base64.b64decode(answer.json()["mask_png"])))
            with Image.open(out / row["mask"]) as written:
                assert np.array_equal(np.asarray(served), np.asarray(written)), row["file"]
            assert (answer.json()["height"], answer.json()["width"]) == (row["height"], row["width"])
            assert len(answer.json()["class_names"]) == len(row["class_shares"])
    finally:
        server.stop(signal.SIGTERM)


# /part
