"""Shards in object storage, against a local S3-compatible server (the object_store fixture): litdata writes
them to s3://bucket/prefix and streams them back through its cache, with only the environment variables a
user of MinIO sets; bad storage settings fail before any work with one line naming the key and the fix."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image
from sklearn.datasets import load_digits

from src.data.components.object_store import check_reachable, is_remote, refuse_credentials, storage_options
from tests.conftest import ROOT, ObjectStore, cli_env, free_port

# What the shard command and data=streaming do with litdata, as scripts a user could run: write a folder of
# PNG files as shards (the encoded bytes, as the shard command stores images), then read them back for two
# epochs, as a training run's loader would, printing what each epoch saw and how fast.
WRITE = """
import sys
from pathlib import Path

import litdata

from src.data.components.object_store import check_reachable, storage_options


def sample(path: str) -> dict:
    index, label = Path(path).stem.split("_")
    return {"image": Path(path).read_bytes(), "label": int(label), "index": int(index)}


if __name__ == "__main__":
    folder, url = sys.argv[1:]
    check_reachable(url, "output_dir")
    files = sorted(str(path) for path in Path(folder).glob("*.png"))
    options = storage_options(url, None, "storage_options")
    litdata.optimize(sample, files, url, chunk_bytes="8KB", num_workers=1, storage_options=options)
"""
READ = """
import io
import json
import sys
import time

import litdata
import numpy as np
from PIL import Image

from src.data.components.object_store import check_reachable, storage_options


def decode(sample: dict) -> dict:
    # In the loader's worker, as data=streaming does: the image bytes come as a memoryview, which cannot leave it
    return {"pixels": int(np.asarray(Image.open(io.BytesIO(sample["image"]))).sum()), "index": sample["index"]}


if __name__ == "__main__":
    url, endpoint, cache_dir = sys.argv[1:]
    config = {"endpoint_url": endpoint}  # data.storage_options, for this script
    check_reachable(url, "data.input_dir", config)
    options = storage_options(url, config, "data.storage_options")
    dataset = litdata.StreamingDataset(url, cache_dir=cache_dir, max_cache_size="10MB", storage_options=options,
                                       transform=decode)
    loader = litdata.StreamingDataLoader(dataset, batch_size=16, num_workers=2)
    epochs = []
    for epoch in range(2):
        start, pixels = time.perf_counter(), {}
        for batch in loader:
            pixels |= dict(zip(batch["index"].tolist(), batch["pixels"].tolist()))
        epochs.append({"samples_per_s": len(pixels) / (time.perf_counter() - start), "pixels": pixels})
    print(json.dumps(epochs))
"""
CHECK = """
import json
import sys

from src.data.components.object_store import check_reachable

for url, options in json.loads(sys.argv[1]):  # data.input_dir, data.storage_options
    try:
        check_reachable(url, "data.input_dir", options)
        print("reachable")
    except Exception as error:
        print(f"{type(error).__name__}: {error}")
"""


def run_script(
    script: Path, source: str, *args: str, env: dict[str, str | None]
) -> subprocess.CompletedProcess:
    """`python <script> args...` from the repository root, with the user's environment plus `env`."""
    script.write_text(source)
    command = [sys.executable, str(script), *args]
    return subprocess.run(command, cwd=ROOT, env=cli_env(**env), capture_output=True, text=True, timeout=300)


def png_folder(folder: Path, count: int) -> dict[int, int]:
    """`count` digits as 24x24 PNG files named <index>_<label>.png; returns each index's pixel sum."""
    digits = load_digits()
    folder.mkdir()
    sums = {}
    for index in range(count):
        pixels = np.asarray(
            Image.fromarray((digits.images[index] * 255 / 16).astype(np.uint8)).resize((24, 24))
        )
        Image.fromarray(pixels).save(folder / f"{index}_{digits.target[index]}.png")
        sums[index] = int(pixels.sum())
    return sums


@pytest.mark.slow
def test_shards_go_to_the_server_and_stream_back_through_the_cache(object_store: ObjectStore, tmp_path: Path):
    sums = png_folder(tmp_path / "images", 300)
    url = f"s3://{object_store.bucket}/{tmp_path.name}/train"
    # Written with the endpoint from AWS_ENDPOINT_URL, as boto3 reads it
    written = run_script(tmp_path / "write.py", WRITE, str(tmp_path / "images"), url, env=object_store.env)
    assert written.returncode == 0, written.stderr[-3000:]
    listed = object_store.client().list_objects_v2(
        Bucket=object_store.bucket, Prefix=f"{tmp_path.name}/train/"
    )
    names = sorted(item["Key"].rpartition("/")[2] for item in listed["Contents"])
    chunks = [name for name in names if name.startswith("chunk-")]
    assert "index.json" in names and len(chunks) > 3, names

    # Read with the endpoint from the config (data.storage_options.endpoint_url) and no AWS_ENDPOINT_URL
    env = {**object_store.env, "AWS_ENDPOINT_URL": None}
    cache = str(tmp_path / "cache")
    read = run_script(tmp_path / "read.py", READ, url, object_store.endpoint, cache, env=env)
    assert read.returncode == 0, read.stderr[-3000:]
    epochs = json.loads(read.stdout.strip().splitlines()[-1])
    for epoch in epochs:  # every sample once per epoch, its image decoded as it was written
        assert {int(index): pixels for index, pixels in epoch["pixels"].items()} == sums
    # Each chunk came from the server once (the one the two workers share maybe twice): the second epoch read
    # them all from the local cache
    fetched = object_store.log.read_text().count(f"GET /{object_store.bucket}/{tmp_path.name}/train/chunk-")
    assert len(chunks) <= fetched <= len(chunks) + 1
    rates = [round(epoch["samples_per_s"]) for epoch in epochs]
    print(f"samples/s: first epoch (from the server) {rates[0]}, second (from the cache) {rates[1]}")


@pytest.mark.parametrize("user", ["allowed", "denied", "wrong secret", "no credentials"])
def test_an_unreachable_store_fails_before_any_work_naming_the_key_and_the_fix(
    object_store: ObjectStore, tmp_path: Path, user: str
):
    url, endpoint = f"s3://{object_store.bucket}/shards", object_store.endpoint
    env, cases = dict(object_store.env), [(url, {})]
    if user == "allowed":
        silent = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        cases += [("s3://no-such-bucket/shards", {}), (url, {"endpoint_url": silent})]
        expected = [
            "reachable",
            f"FileNotFoundError: data.input_dir=s3://no-such-bucket/shards: there is no bucket no-such-bucket at "
            f"{endpoint}; create it, or correct data.input_dir",
            f"ConnectionError: data.input_dir={url}: the endpoint {silent} does not answer "
            "(EndpointConnectionError); start the server, or set the right one in AWS_ENDPOINT_URL or "
            "data.storage_options.endpoint_url",
        ]
    elif user == "denied":
        env = dict(object_store.denied_env)
        expected = [
            f"PermissionError: data.input_dir={url}: access to bucket shards at {endpoint} is denied to these "
            "credentials (AccessDenied); grant them list and read access"
        ]
    elif user == "wrong secret":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
        expected = [
            f"PermissionError: data.input_dir={url}: {endpoint} rejects the credentials (SignatureDoesNotMatch); "
            "correct AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        ]
    else:  # none in the environment, no ~/.aws files, not on a cloud machine
        nowhere = str(tmp_path / "absent")
        env |= {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SHARED_CREDENTIALS_FILE": nowhere,
                "AWS_CONFIG_FILE": nowhere, "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip
        expected = [
            f"PermissionError: data.input_dir={url}: no credentials found for {endpoint}; set AWS_ACCESS_KEY_ID "
            "and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) in the environment, or put them in "
            "~/.aws/credentials, or run where an instance role provides them"
        ]
    result = run_script(tmp_path / "check.py", CHECK, json.dumps(cases), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == len(expected) and all(map(str.startswith, lines, expected)), lines


def test_a_secret_in_a_config_is_refused_without_showing_it():
    for options, where in [
        ({"aws_access_key_id": "AKIA1"}, "data.storage_options.aws_access_key_id"),
        (
            {"endpoint_url": "http://x", "aws_secret_access_key": "s3cr3t"},
            "data.storage_options.aws_secret_access_key",
        ),
        ({"config": {"retries": 3, "session_token": "t0k"}}, "data.storage_options.config.session_token"),
        ({"key": "k", "secret": "s"}, "data.storage_options.key"),  # fsspec's names
        (
            OmegaConf.create({"client_options": [{"api_key": "k"}]}),
            "data.storage_options.client_options[0].api_key",
        ),
    ]:
        with pytest.raises(ValueError) as error:
            refuse_credentials(options, "data.storage_options")
        message = str(error.value)
        assert message.startswith(f"{where}: credentials are not accepted in a config (configs are logged)")
        assert (
            "AWS_ACCESS_KEY_ID" in message and "~/.aws/credentials" in message and "instance role" in message
        )
        assert "\n" not in message
        assert not any(secret in message for secret in ("AKIA1", "s3cr3t", "t0k", "=k", "=s"))
    refuse_credentials({"endpoint_url": "http://x", "region_name": "eu-west-1"}, "data.storage_options")


def test_storage_options_are_plain_checked_and_only_for_urls():
    config = OmegaConf.create({"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"})
    options = storage_options("s3://bucket/shards", config, "data.storage_options")
    assert options == {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}
    assert type(options) is dict
    assert storage_options("/data/shards", config, "data.storage_options") == {}
    with pytest.raises(ValueError, match=r"^data.storage_options.endpoint is not an option for s3://; choose from "
                       r"endpoint_url, region_name, use_ssl, verify$"):  # fmt: skip
        storage_options("s3://bucket/shards", {"endpoint": "http://x"}, "data.storage_options")
    with pytest.raises(ValueError, match=r"^data.storage_options.token: credentials are not accepted"):
        storage_options("/data/shards", {"token": "t"}, "data.storage_options")  # refused even when unused
    assert [is_remote(p) for p in ("s3://b/p", "gs://b/p", "r2://b/p", "/data/shards", "data/shards", "C:/d")] == [
        True, True, True, False, False, False,
    ]  # fmt: skip


def test_a_url_without_a_bucket_fails_naming_the_key():
    with pytest.raises(
        ValueError, match=r"^data.input_dir=s3:///shards names no bucket; write s3://<bucket>/<prefix>$"
    ):
        check_reachable("s3:///shards", "data.input_dir")
