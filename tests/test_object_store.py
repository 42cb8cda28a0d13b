"""Object storage, against a local S3-compatible server (the object_store fixture): bad storage settings fail
before any work with one line naming the key and the fix. (Shards written there and trained from, through the
cache, with the endpoint from AWS_ENDPOINT_URL and from the config: tests/test_streaming.py.)"""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src.data.components.object_store import check_reachable, is_remote, refuse_credentials, storage_options
from tests.conftest import ObjectStore, free_port


def as_user(monkeypatch: pytest.MonkeyPatch, env: dict[str, str | None]) -> None:
    """The environment plus `env` (None: without it), read as a new process would read it."""
    import boto3

    for name, value in env.items():
        monkeypatch.delenv(name, raising=False) if value is None else monkeypatch.setenv(name, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it keeps the credentials it found first


def test_an_unreachable_store_fails_before_any_work_naming_the_key_and_the_fix(
    object_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    url, endpoint = f"s3://{object_store.bucket}/shards", object_store.endpoint

    def refused(error: type[Exception], message: str, at: str = url):
        return pytest.raises(error, match="^" + re.escape(f"data.input_dir={at}: {message}"))

    as_user(monkeypatch, object_store.env)
    check_reachable(url, "data.input_dir")
    missing = "s3://no-such-bucket/shards"
    with refused(FileNotFoundError, f"there is no bucket no-such-bucket at {endpoint}; create it, or correct "
                 "data.input_dir", at=missing):  # fmt: skip
        check_reachable(missing, "data.input_dir")
    silent = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with refused(ConnectionError, f"the endpoint {silent} does not answer (EndpointConnectionError); "
                 "start the server, or set the right one in AWS_ENDPOINT_URL or "
                 "data.storage_options.endpoint_url"):  # fmt: skip
        check_reachable(url, "data.input_dir", {"endpoint_url": silent})

    as_user(monkeypatch, object_store.denied_env)
    with refused(PermissionError, f"access to bucket shards at {endpoint} is denied to these credentials "
                 "(AccessDenied); grant them list and read access"):  # fmt: skip
        check_reachable(url, "data.input_dir")
    as_user(monkeypatch, object_store.env | {"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    with refused(PermissionError, f"{endpoint} rejects the credentials (SignatureDoesNotMatch); correct "
                 "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):  # fmt: skip
        check_reachable(url, "data.input_dir")
    nowhere = str(tmp_path / "absent")  # no keys in the environment, no ~/.aws files, not on a cloud machine
    as_user(monkeypatch, object_store.env | {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
            "AWS_SHARED_CREDENTIALS_FILE": nowhere, "AWS_CONFIG_FILE": nowhere,
            "AWS_EC2_METADATA_DISABLED": "true"})  # fmt: skip
    with refused(PermissionError, f"no credentials found for {endpoint}; set AWS_ACCESS_KEY_ID and "
                 "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) in the environment, or put them in "
                 "~/.aws/credentials, or run where an instance role provides them"):  # fmt: skip
        check_reachable(url, "data.input_dir")


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
    with pytest.raises(
        ValueError,
        match=r"^data.storage_options.endpoint is not an option for s3://; choose from "
        r"endpoint_url, region_name, use_ssl, verify$",
    ):
        storage_options("s3://bucket/shards", {"endpoint": "http://x"}, "data.storage_options")
    with pytest.raises(ValueError, match=r"^data.storage_options.token: credentials are not accepted"):
        storage_options("/data/shards", {"token": "t"}, "data.storage_options")  # refused even when unused
    assert [
        is_remote(p) for p in ("s3://b/p", "gs://b/p", "r2://b/p", "/data/shards", "data/shards", "C:/d")
    ] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]


def test_a_url_without_a_bucket_fails_naming_the_key():
    with pytest.raises(
        ValueError, match=r"^data.input_dir=s3:///shards names no bucket; write s3://<bucket>/<prefix>$"
    ):
        check_reachable("s3:///shards", "data.input_dir")
