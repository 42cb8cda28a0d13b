"""Load on a served run: N clients send requests one after another for T seconds, first to a server without
batching, then to one with (both started at once; the one with waits idle while the first is measured
and stopped); prints requests/s and p50/p99 latency of each, and their ratio.

    python scripts/serve_load.py --run-dir logs/train/runs/<run> --clients 16 --seconds 20

Each server is `python src/serve.py run_dir=<run> accelerator=cpu log_level=warning` with max_batch_size=1,
then with --batch-size and --batch-timeout; every client sends the same image (--image, else a grey one of
the model's input size) over its own keep-alive connection. The clients run in this process, one thread
each: on a small machine they share its cores with the server, and the figures it prints include that cost.
"""

import argparse
import base64
import http.client
import io
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT = 180  # seconds until /health answers 200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def grey_image(run_dir: Path) -> bytes:
    """A PNG of the model's input size and colour mode, as its checkpoint says."""
    from PIL import Image

    from src.run.checkpoints import load_checkpoint

    checkpoint = next(
        p for p in (run_dir / "checkpoints" / n for n in ("best.ckpt", "last.ckpt")) if p.is_file()
    )
    preprocessing = load_checkpoint(checkpoint)["hyper_parameters"]["preprocessing"]
    _, height, width = preprocessing["input_shape"]
    png = io.BytesIO()
    Image.new(preprocessing["image_mode"] or "RGB", (width, height), 128).save(png, format="PNG")
    return png.getvalue()


def wait_healthy(port: int, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server ended with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server did not answer /health in {STARTUP_TIMEOUT} s:\n{log.read_text()[-3000:]}")


def client(port: int, body: bytes, until: float, latencies: list[float], errors: list[int]) -> None:
    """Requests one after another on one keep-alive connection until `until`; their latencies in seconds."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json"}
    while time.monotonic() < until:
        start = time.perf_counter()
        connection.request("POST", "/predict", body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        if response.status == 200:
            latencies.append(time.perf_counter() - start)
        else:
            errors.append(response.status)
    connection.close()


class Server:
    """`python src/serve.py run_dir=<run> ...` with max_batch_size=`batch_size`, on a free port."""

    def __init__(self, args: argparse.Namespace, batch_size: int, log_dir: Path) -> None:
        self.batch_size, self.port = batch_size, free_port()
        overrides = [
            f"run_dir={args.run_dir}",
            f"port={self.port}",
            f"max_batch_size={batch_size}",
            f"batch_timeout={args.batch_timeout}",
            f"workers={args.workers}",
            "accelerator=cpu",
            "log_level=warning",
            "extras.print_config=false",
            f"paths.log_dir={log_dir}",
        ]
        self.log = log_dir / f"server_{batch_size}.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(ROOT / "src" / "serve.py"), *overrides],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)


def measure(args: argparse.Namespace, body: bytes, server: Server) -> dict[str, float]:
    """Load the started `server` with the clients for args.seconds, then stop it."""
    try:
        wait_healthy(server.port, server.process, server.log)
        warm = time.monotonic() + 1
        client(server.port, body, warm, [], [])  # the first requests pay for lazy setup
        latencies: list[float] = []
        errors: list[int] = []
        until = time.monotonic() + args.seconds
        threads = [
            threading.Thread(target=client, args=(server.port, body, until, latencies, errors))
            for _ in range(args.clients)
        ]
        start = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - start
    finally:
        server.stop()
    if not latencies:
        raise SystemExit(f"no request was answered (errors: {errors[:5]}):\n{server.log.read_text()[-3000:]}")
    cuts = statistics.quantiles(latencies, n=100)
    return {
        "max_batch_size": server.batch_size,
        "requests": len(latencies),
        "errors": len(errors),
        "requests_per_sec": len(latencies) / elapsed,
        "p50_ms": cuts[49] * 1000,
        "p99_ms": cuts[98] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--run-dir", type=Path, required=True, help="a training run dir (logs/train/runs/<run>)"
    )
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=20, help="how long the clients send, per server")
    parser.add_argument("--batch-size", type=int, default=16, help="max_batch_size with batching on")
    parser.add_argument("--batch-timeout", type=float, default=0.01, help="batch_timeout with batching on")
    parser.add_argument("--workers", type=int, default=1, help="the server's model processes")
    parser.add_argument("--image", type=Path, default=None, help="the image every request sends")
    parser.add_argument("--output", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if not (args.run_dir / "checkpoints").is_dir():
        parser.error(f"--run-dir {args.run_dir} has no checkpoints/; give a training run dir")
    image = args.image.read_bytes() if args.image else grey_image(args.run_dir)
    body = json.dumps({"image": base64.b64encode(image).decode("ascii")}).encode()

    with tempfile.TemporaryDirectory() as log_dir:
        # Both start at once (each takes seconds to import and load); the second waits, idle, while the
        # first is measured and stopped.
        servers = [Server(args, batch_size, Path(log_dir)) for batch_size in (1, args.batch_size)]
        try:
            off, on = (measure(args, body, server) for server in servers)
        finally:
            for server in servers:
                server.stop()
    figures = {
        "settings": {key: str(value) for key, value in vars(args).items()},
        "batching_off": off,
        "batching_on": on,
        "ratio_requests_per_sec": on["requests_per_sec"] / off["requests_per_sec"],
    }
    print(f"{args.clients} clients for {args.seconds:g} s each, {args.run_dir}")
    print(f"{'':14}{'max_batch':>10}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
    for name, row in (("batching off", off), ("batching on", on)):
        print(
            f"{name:14}{row['max_batch_size']:>10}{row['requests_per_sec']:>10.1f}{row['p50_ms']:>10.1f}"
            f"{row['p99_ms']:>10.1f}{row['errors']:>8}"
        )
    print(f"batching on / off: {figures['ratio_requests_per_sec']:.2f}x the requests/s")
    if args.output:
        args.output.write_text(json.dumps(figures, indent=1) + "\n")
        print(f"Wrote {args.output}")


if __name__ == "__main__":
    main()
