"""Shared fixtures: compose the real configs, and run the real command line, writing into tmp_path."""

import csv
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time  # [part: streaming]
from collections.abc import Callable, Sequence
from dataclasses import dataclass  # [part: streaming]
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import src  # noqa: F401 - registers the config resolvers

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"

# One thread per process: `pytest -n 2` runs two test processes on 2 cores, and the processes they start. Set
# before torch is imported, so that runs in a test process compute as the commands they are compared with. No
# other variable is set for all tests: one that users do not set could hide a bug they meet.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# part: template
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--matrix",
        action="store_true",
        help="also run the tests marked matrix: the template maintainers' checks (make test-parts)",
    )


# /part


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first, each file's in their order: with `pytest -n 2` the longest ones start early and
    the quick ones fill in at the end, instead of one long test running alone after all the others."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    # part: template
    if not config.getoption("--matrix"):  # the generation matrix runs only when asked for
        matrix = [item for item in items if item.get_closest_marker("matrix")]
        config.hook.pytest_deselected(items=matrix)
        items[:] = [item for item in items if not item.get_closest_marker("matrix")]
    # /part


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder of the session's that `build(folder)` filled once: with `pytest -n 2` the first of the two
    test processes to ask builds it and the other waits for it, instead of both building their own."""
    base = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        base = base.parent  # each process's own base (popen-gw0, popen-gw1) is in the session's
    folder = base / name
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when build() fails
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir for the whole session, so each dataset is parsed or built once. Both test processes write
    their caches into it: each cache file is written whole, then renamed."""
    return built_once(tmp_path_factory, "data", lambda folder: None)


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """The run dir of `python src/train.py data=digits model/net=mlp trainer.max_epochs=2 run_name=mlp`, trained
    once for the tests that need a trained run; they write their own outputs into their own tmp_path."""

    def train(log_dir: Path) -> None:
        from src import api

        overrides = ["data=digits", "model/net=mlp", "trainer.max_epochs=2", "run_name=mlp"]
        api.train([*paths(log_dir, data_dir), *overrides])

    return built_once(tmp_path_factory, "digits_run", train) / "train" / "runs" / "mlp"


# One batch of each stage, with the callbacks a debug preset would turn off.
ONE_BATCH = [
    "trainer.max_epochs=1",
    *(f"+trainer.limit_{stage}_batches=1" for stage in ("train", "val", "test")),
]
# part: segmentation
# A few scenes: enough for every class to appear in each split, seconds to train.
SMALL_SCENES = ["data.scenes=[192,64,64]", "data.batch_size=32"]
# /part


# part: segmentation
@pytest.fixture(scope="session")
def segment_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """`python src/train.py experiment=segment_digits` on a few scenes for two epochs, named `seg`."""

    def train(log_dir: Path) -> None:
        from src import api

        overrides = ["experiment=segment_digits", *SMALL_SCENES, "trainer.max_epochs=2", "run_name=seg"]
        api.train([*paths(log_dir, data_dir), *overrides])

    return built_once(tmp_path_factory, "segment_run", train) / "train" / "runs" / "seg"


# /part


def csv_unless_chosen(config_name: str, overrides: Sequence[str]) -> list[str]:
    """`logger=csv` for a train or eval run whose test chooses no logger (see `paths`)."""
    chosen = any(o.lstrip("+~").startswith(("logger=", "logger.", "experiment=")) for o in overrides)
    return list(overrides) if chosen or config_name not in ("train", "eval") else [*overrides, "logger=csv"]


@pytest.fixture
def here(tmp_path: Path, data_dir: Path) -> list[str]:
    """`paths` into tmp_path, put first in a `src.api` call (`api.train([*here, "data=digits"])`)."""
    return paths(tmp_path, data_dir)


@pytest.fixture
def here_for_inference(tmp_path: Path, data_dir: Path) -> list[str]:
    """`here` for `api.predict` and `api.export`, whose configs have no logger to choose."""
    return [override for override in paths(tmp_path, data_dir) if not override.startswith("logger=")]


def paths(log_dir: Path, data_dir: Path) -> list[str]:
    """A run's logs into `log_dir`, its data from `data_dir`, its metrics into a CSV log that tests read (a
    project may default to wandb, which needs a login; a later `logger=` wins); no config tree printed."""
    return [
        f"paths.log_dir={log_dir}",
        f"paths.data_dir={data_dir}",
        "extras.print_config=false",
        "logger=csv",
    ]


@pytest.fixture
def compose_cfg(tmp_path: Path, data_dir: Path):
    """Compose `train` or `eval` with overrides, as `python src/<name>.py` would, writing into tmp_path."""

    def _compose(config_name: str = "train", overrides: list[str] = ()) -> DictConfig:
        from src import api

        GlobalHydra.instance().clear()  # what a test that failed inside a compose left
        cfg = api.compose(config_name, csv_unless_chosen(config_name, overrides))
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path)
            cfg.paths.log_dir = str(tmp_path / "logs")
            cfg.paths.data_dir = str(data_dir)
            del cfg.hydra
        return cfg

    yield _compose
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None  # the next test in this process is outside any Hydra run


def cli_command(script: str, *overrides: str, log_dir: Path, data_dir: Path, launcher: Sequence[str] = ()):
    """`python [launcher] src/<script>.py overrides...`, writing logs and data into the given folders."""
    script_path = str(ROOT / "src" / f"{script}.py")
    paths = [f"paths.log_dir={log_dir}", f"paths.data_dir={data_dir}", "extras.print_config=false"]
    return [sys.executable, *launcher, script_path, *csv_unless_chosen(script, overrides), *paths]


def cli_env(**extra: str | None) -> dict[str, str]:
    """The user's environment plus `extra` (None: without that variable); HYDRA_FULL_ERROR=0 so that errors
    read as a user sees them."""
    merged = {**os.environ, "HYDRA_FULL_ERROR": "0", **extra}
    return {name: value for name, value in merged.items() if value is not None}


def run_cli(
    script: str,
    *overrides: str,
    log_dir: Path,
    data_dir: Path,
    cwd: Path = ROOT,
    timeout: int = 300,
    launcher: Sequence[str] = (),
    env: dict[str, str | None] | None = None,
) -> subprocess.CompletedProcess:
    """Run `python [launcher] src/<script>.py overrides...` as a user would; return the completed process.

    A new process, which first imports torch and Lightning (about 7 s on 2 cores): tests run tasks through
    `src.api` unless the command line or the process is what they test. `launcher` goes between python and the
    script, e.g. `torchrun(...)`; `env` is added to the user's environment (see cli_env).
    """
    command = cli_command(script, *overrides, log_dir=log_dir, data_dir=data_dir, launcher=launcher)
    return run_python(*command[1:], cwd=cwd, env=env, timeout=timeout)


def run_python(
    *args: str | Path, cwd: Path = ROOT, env: dict[str, str | None] | None = None, timeout: int = 300
) -> subprocess.CompletedProcess:
    """Run `python args...` in a new process, with the user's environment plus `env` (see cli_env)."""
    command, full_env = [sys.executable, *map(str, args)], cli_env(**(env or {}))
    return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def start_cli(
    script: str,
    *overrides: str,
    log_dir: Path,
    data_dir: Path,
    output: Path,
    env: dict[str, str | None] | None = None,
) -> subprocess.Popen:
    """Start `python src/<script>.py overrides...` as a user would, without waiting for it (for commands that
    run at the same time, or are signalled); its output goes into `output` (stdout) and `output` + `.err`
    (stderr); `env` as for run_cli."""
    command = cli_command(script, *overrides, log_dir=log_dir, data_dir=data_dir)
    with open(output, "w") as out, open(f"{output}.err", "w") as err:
        return subprocess.Popen(command, cwd=ROOT, env=cli_env(**(env or {})), stdout=out, stderr=err)


def torchrun(*args: str) -> list[str]:
    """The launcher part of a `torchrun <args> src/train.py` command line."""
    return ["-m", "torch.distributed.run", *args]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def last_metrics(run_dir: Path) -> dict[str, float]:
    """The last value of every metric in a run's CSV log."""
    values: dict[str, float] = {}
    with open(run_dir / "csv" / "version_0" / "metrics.csv") as file:
        for row in csv.DictReader(file):
            values |= {k: float(v) for k, v in row.items() if v not in ("", None)}
    return values


def only_run_dir(log_dir: Path, task: str = "train") -> Path:
    runs = list((log_dir / task / "runs").iterdir())
    assert len(runs) == 1, f"expected one run dir, found {runs}"
    return runs[0]


def assert_single_run_dir(run_dir: Path, log_name: str = "train.log") -> None:
    """One config snapshot, one log file, one checkpoints folder, and nothing written by another rank."""
    assert sorted(p.name for p in run_dir.glob("**/*.log")) == [log_name]
    assert len(list(run_dir.glob("**/.hydra"))) == 1
    assert len(list(run_dir.glob("**/checkpoints"))) == 1
    assert "rank: 1]" not in (run_dir / log_name).read_text()  # the other ranks log to the console only


# part: predict
@pytest.fixture(scope="module")
def digit_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six digits as PNG files of another size than the 8x8 the model saw; named <index>_<digit>.png."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    folder = tmp_path_factory.mktemp("digits_png")
    digits = load_digits()
    for i in range(6):
        pixels = (digits.images[i] * 255 / 16).astype(np.uint8)
        Image.fromarray(pixels).resize((24, 24)).save(folder / f"{i}_{digits.target[i]}.png")
    return folder


# /part


# part: streaming
@dataclass
class ObjectStore:
    """A local S3-compatible server with a bucket. `env`: what a user of such a server (MinIO, say) sets, for
    `env=` of run_cli; `denied_env`: the same for a user whose keys the server knows but who may not use the
    bucket. `log`: the server's log, one line per request."""

    endpoint: str
    bucket: str
    env: dict[str, str | None]
    denied_env: dict[str, str | None]
    log: Path

    def client(self):
        """A boto3 S3 client of the allowed user, to look at what a command wrote."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.env["AWS_DEFAULT_REGION"],
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
        )


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory):
    """moto's S3 server (the moto[server] package of the dev extra, standing in for S3 or MinIO) on 127.0.0.1,
    checking credentials and permissions as S3 does. Its first 5 requests go unchecked: they create its two
    users, one allowed everything, one nothing."""
    import json

    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("object_store") / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "5"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        region = "us-east-1"
        iam = boto3.client("iam", endpoint_url=endpoint, region_name=region, aws_access_key_id="setup",
                           aws_secret_access_key="setup")  # fmt: skip
        allow_s3 = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        iam.create_user(UserName="shards")
        iam.put_user_policy(UserName="shards", PolicyName="s3", PolicyDocument=json.dumps(allow_s3))
        iam.create_user(UserName="denied")
        envs = {}
        for user in ("shards", "denied"):
            key = iam.create_access_key(UserName=user)["AccessKey"]
            envs[user] = {
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
                "AWS_DEFAULT_REGION": region,
                # What else would choose other credentials or another endpoint, on a developer's machine
                "AWS_PROFILE": None,
                "AWS_SESSION_TOKEN": None,
                "AWS_ENDPOINT_URL_S3": None,
            }
        store = ObjectStore(endpoint, "shards", envs["shards"], envs["denied"], log)
        store.client().create_bucket(Bucket=store.bucket)
        yield store
    finally:
        server.terminate()
        server.wait(timeout=30)


# /part
