"""Streaming shards against the image folder they were written from: samples per second of the training loader.

    python scripts/benchmark_streaming.py            # 3 alternating repetitions (a minute or two)
    python scripts/benchmark_streaming.py --tiny     # 300 digits, once: checks the script, not speed

1. Local: one epoch of the training loader alone (no model) of data=mnist_images, the example folder of
   5,000 PNG digits (written into data/ on first use), against one epoch of data=streaming on the shards
   `python src/shard.py data=mnist_images` writes of that folder: the same samples, transforms, batch size and
   workers. Goal: the shards at least as fast as the folder.
2. Object storage: the same shards written to a local S3-compatible server (moto's, started here on 127.0.0.1
   and stopped at the end; the credentials and endpoint given in AWS_* environment variables, as a MinIO user
   gives them) and read through an empty data.cache_dir: the first epoch (every chunk downloaded) against the
   second (from the warm cache). Goal: the second at least twice as fast. The shards are cut into small chunks
   (--chunk-bytes) so that the set is many chunks, as a large data set is: with one chunk the first epoch
   would be one download.

Every figure is a median of --repeats runs, the folder and the local shards alternating which goes first; the
ratios are measured in this one run (no figures from elsewhere). The results also go to a JSON file
(logs/benchmark/streaming-<time>.json by default).
"""

import argparse
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmark import machine  # scripts/benchmark.py, beside this file

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
SHARDS_GOAL = 1.0  # local shards' rate over the folder's
WARM_CACHE_GOAL = 2.0  # the second epoch's rate over the first's, from the S3 server
BUCKET = "benchmark"
TINY = ["+data.prepare.count=300", "+data.prepare.test=60"]  # a folder of 300 digits, in a temporary data dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="alternating repetitions per figure")
    parser.add_argument("--num-workers", type=int, default=2, help="data.num_workers of every loader")
    parser.add_argument("--batch-size", type=int, default=64, help="data.batch_size of every loader")
    parser.add_argument("--chunk-bytes", default="64KB", help="the shard command's chunk_bytes")
    parser.add_argument("--tiny", action="store_true", help="300 digits, once: a smoke test")
    parser.add_argument("--output", type=Path, default=None, help="the JSON file to write")
    args = parser.parse_args()
    if args.repeats < 1 or args.num_workers < 0 or args.batch_size < 1:
        parser.error("--repeats and --batch-size must be at least 1, --num-workers at least 0")
    for package in ("litdata", "boto3", "moto"):  # the streaming extra's, and the dev extra's S3 server
        if importlib.util.find_spec(package) is None:
            parser.error(
                f'{package} is not installed: pip install -e ".[streaming,dev]" (or make install-test)'
            )
    if args.tiny:
        args.repeats = 1
    # A `kill` of this script stops it as Ctrl-C does: through the `finally`s that stop the server.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    results = {"machine": {**machine("cpu"), "load_average": os.getloadavg()}}
    with tempfile.TemporaryDirectory(prefix="benchmark-streaming-") as scratch:
        results |= measure(args, Path(scratch))
    output = args.output or ROOT / "logs" / "benchmark" / f"streaming-{datetime.now():%Y-%m-%d_%H-%M-%S}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"\nWrote {output}")


def measure(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    from src.data.components.shards import litdata  # what data=streaming reads with, configured alike

    data_dir = scratch / "data" if args.tiny else ROOT / "data"
    loader = [f"data.batch_size={args.batch_size}", f"data.num_workers={args.num_workers}"]
    source = ["data=mnist_images", *(TINY if args.tiny else []), *loader]
    paths = [f"paths.data_dir={data_dir}", f"paths.log_dir={scratch / 'logs'}"]
    shards = scratch / "shards"
    write_shards(args, [*source, *paths], str(shards))  # also writes the example folder on first use
    folder = datamodule([*source, *paths])
    local = datamodule(["data=streaming", f"data.input_dir={shards}", *loader, *paths])
    index = json.loads((shards / "train" / "index.json").read_text())
    runs: dict[str, list[float]] = {
        side: []
        for side in ("folder", "shards", "s3_first_epoch", "s3_second_epoch", "s3_raw_first", "s3_raw_second")
    }
    downloads: dict[str, list[int]] = {"s3_first_epoch": [], "s3_second_epoch": []}  # chunks, per run
    with s3_server(scratch / "s3.log") as endpoint:
        url = f"s3://{BUCKET}/shards"
        write_shards(args, [*source, *paths], url)
        for repeat in range(args.repeats):
            sides = {"folder": folder, "shards": local}
            for side in sorted(sides, reverse=bool(repeat % 2)):  # alternate who goes first
                runs[side].append(epoch_rate(sides[side].train_dataloader()))
            cache = scratch / f"cache-{repeat}"  # empty: every chunk is downloaded in the first epoch
            remote = datamodule(
                ["data=streaming", f"data.input_dir={url}", f"data.cache_dir={cache}", *loader]
            )
            train = remote.train_dataloader()
            for epoch in ("s3_first_epoch", "s3_second_epoch"):  # the same loader twice, as a run's epochs
                before = chunk_downloads(scratch / "s3.log")
                runs[epoch].append(epoch_rate(train))
                downloads[epoch].append(chunk_downloads(scratch / "s3.log") - before)
            # The stored samples alone, not decoded: what the cache serves, without the PNG decoding and
            # transforms that cost the same in both epochs.
            raw = litdata().StreamingDataset(f"{url}/train", cache_dir=str(scratch / f"raw-cache-{repeat}"))
            for epoch in ("s3_raw_first", "s3_raw_second"):
                runs[epoch].append(raw_rate(raw))
    rates = {side: statistics.median(values) for side, values in runs.items()}
    return {
        "settings": {
            "repeats": args.repeats,
            "num_workers": args.num_workers,
            "batch_size": args.batch_size,
            "chunk_bytes": args.chunk_bytes,
            "tiny": args.tiny,
            "train_samples": sum(chunk["chunk_size"] for chunk in index["chunks"]),
            "train_chunks": len(index["chunks"]),
            "s3_endpoint": endpoint,
        },
        "samples_per_sec": rates,
        # How much the repetitions disagree (max - min over the median): the noise of this machine.
        "spread": {side: (max(values) - min(values)) / rates[side] for side, values in runs.items()},
        "runs": runs,
        "chunk_downloads": downloads,
        "shards_over_folder": rates["shards"] / rates["folder"],
        "second_over_first_epoch": rates["s3_second_epoch"] / rates["s3_first_epoch"],
        "raw_second_over_first": rates["s3_raw_second"] / rates["s3_raw_first"],
        "goals": {
            "shards_over_folder": SHARDS_GOAL,
            "second_over_first_epoch": WARM_CACHE_GOAL,
            "raw_second_over_first": WARM_CACHE_GOAL,
        },
    }


def write_shards(args: argparse.Namespace, overrides: list[str], output: str) -> None:
    """`python src/shard.py data=mnist_images ... output_dir=<output>`, as a user shards the folder."""
    command = [PYTHON, "src/shard.py", *overrides, f"output_dir={output}", f"chunk_bytes={args.chunk_bytes}"]
    command += [f"num_workers={max(1, args.num_workers)}", "extras.print_config=false"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"the shard command failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-3000:]}"
        )


def datamodule(overrides: list[str]) -> Any:
    """The data option of `overrides`, composed as a run composes it, prepared and set up for training."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"paths.root_dir={ROOT}"])
    data = instantiate(cfg.data, _convert_="all")
    data.prepare_data()
    data.setup("fit")
    return data


def epoch_rate(loader: Any) -> float:
    """Samples per second of one whole pass over `loader`, its workers' start included (as every epoch's)."""
    begin, samples = time.perf_counter(), 0
    for images, *_ in loader:
        samples += len(images)
    return samples / (time.perf_counter() - begin)


def raw_rate(dataset: Any) -> float:
    """Samples per second of one pass over a StreamingDataset in this process (its samples hold memoryviews of
    the chunks, which cannot leave a DataLoader worker)."""
    begin = time.perf_counter()
    samples = sum(1 for _ in dataset)
    return samples / (time.perf_counter() - begin)


def chunk_downloads(log: Path) -> int:
    """How many chunk files the S3 server has sent so far (GETs of a `.bin` in its request log)."""
    return sum('"GET /' in line and ".bin " in line for line in log.read_text().splitlines())


@contextmanager
def s3_server(log: Path) -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1 with an empty bucket, reached through the AWS_* variables
    of this process and the commands it starts (as a user of MinIO or any S3-compatible store sets them):
    its endpoint. Stopped on the way out, also on an error or Ctrl-C."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's server did not start on {endpoint}:\n{log.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):  # would pick another store
            os.environ.pop(name, None)
        os.environ |= {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "benchmark",  # moto's server takes any credentials
            "AWS_SECRET_ACCESS_KEY": "benchmark",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def print_table(results: dict[str, Any]) -> None:
    s, rates, spread = results["settings"], results["samples_per_sec"], results["spread"]
    print(
        f"\nTraining loader alone, samples/s, median of {s['repeats']}: {s['train_samples']} samples, "
        f"batch size {s['batch_size']}, {s['num_workers']} workers; shards of chunk_bytes={s['chunk_bytes']} "
        f"({s['train_chunks']} training chunks)"
    )
    rows = {
        "folder": "data=mnist_images (PNG files)",
        "shards": "data=streaming, local shards",
        "s3_first_epoch": "S3 server, 1st epoch (empty cache)",
        "s3_second_epoch": "S3 server, 2nd epoch (warm cache)",
        "s3_raw_first": "S3, stored samples alone, 1st (no workers)",
        "s3_raw_second": "S3, stored samples alone, 2nd",
    }
    downloads = results["chunk_downloads"]
    print(f"{'loader':44}{'samples/s':>10}{'spread':>8}{'chunks fetched':>16}")
    for side, label in rows.items():
        fetched = f"{statistics.median(downloads[side]):16.0f}" if side in downloads else ""
        print(f"{label:44}{rates[side]:10.0f}{spread[side]:8.2f}{fetched}")
    for ratio, (what, base) in {
        "shards_over_folder": ("local shards", "the folder"),
        "second_over_first_epoch": ("2nd epoch from S3", "the 1st"),
        "raw_second_over_first": ("2nd pass over the stored samples from S3", "the 1st"),
    }.items():
        goal, value = results["goals"][ratio], results[ratio]
        met = "met" if value >= goal else "NOT met"
        print(f"{what} / {base}: x{value:.2f} (goal >= {goal:g}: {met})")


if __name__ == "__main__":
    main()
