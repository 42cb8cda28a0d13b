"""Shards in object storage (s3://: AWS, or any S3-compatible store): which URLs are remote, the client options litdata needs, credentials
kept out of configs, and a reachability check that fails before sharding or training starts.

litdata reaches S3 through boto3, so an S3-compatible server (MinIO, or moto in the tests) is reached the way
boto3 reaches it: `AWS_ENDPOINT_URL` in the environment, or `endpoint_url` in the config's storage options;
credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ~/.aws/credentials or an instance role.

Importing this module makes litdata move s3:// files with boto3 alone (see Boto3Downloader), so a process
litdata starts with `spawn` does the same only if it imports this module: the module of `optimize`'s function
and of the dataset's transform import it.
"""

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from litdata.streaming.client import S3Client
from litdata.streaming.downloader import Downloader, register_downloader
from omegaconf import DictConfig, OmegaConf

# botocore logs at INFO where each client found its endpoint: noise in every run's log.
logging.getLogger("botocore").setLevel(logging.WARNING)

# The URL schemes litdata reads shards from (writing: s3, gs and r2).
REMOTE_SCHEMES = ("s3", "gs", "r2", "azure", "hf")
# What an s3:// config may set: boto3's client arguments that are not secrets.
S3_OPTIONS = ("endpoint_url", "region_name", "use_ssl", "verify")
AWS_CREDENTIALS = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) in the environment, or put them in "
    "~/.aws/credentials, or run where an instance role provides them"
)


def is_remote(path: str) -> bool:
    """Whether `path` is an object-storage URL litdata reads through a client and a local cache, not a folder."""
    return urlparse(str(path)).scheme in REMOTE_SCHEMES


def refuse_credentials(options: Mapping | None, key: str) -> None:
    """Refuse a config that holds a secret (an access key, a secret, a token, at any depth under `key`): configs
    are logged, in the run dir and to wandb, so a secret there leaks. The message never shows the value."""
    for name, value in (options or {}).items():
        lowered = str(name).lower()
        if (
            lowered == "key"
            or lowered.endswith(("_key", "key_id"))
            or any(word in lowered for word in ("secret", "token", "password", "credential"))
        ):
            raise ValueError(
                f"{key}.{name}: credentials are not accepted in a config (configs are logged); remove it and "
                f"{AWS_CREDENTIALS}"
            )
        listed = isinstance(value, Sequence) and not isinstance(value, str | bytes)
        for index, item in enumerate(value if listed else [value]):
            if isinstance(item, Mapping):
                refuse_credentials(item, f"{key}.{name}" if item is value else f"{key}.{name}[{index}]")


def storage_options(url: str, options: Mapping | None, key: str) -> dict[str, Any]:
    """The `storage_options` for litdata's `optimize` and `StreamingDataset` on `url`, from the config's
    `options` (at `key`), as a plain dict: a secret is refused, and for s3:// an unknown option is refused now
    rather than by boto3 in a worker. A local folder needs none."""
    if isinstance(options, DictConfig):
        options = OmegaConf.to_container(options, resolve=True)
    options = dict(options or {})
    refuse_credentials(options, key)
    if not is_remote(url):
        return {}
    if urlparse(url).scheme == "s3":
        for name in options:
            if name not in S3_OPTIONS:
                raise ValueError(
                    f"{key}.{name} is not an option for s3://; choose from {', '.join(S3_OPTIONS)}"
                )
    return options


def check_reachable(url: str, key: str, options: Mapping | None = None) -> None:
    """Fail in seconds, with one line naming `key` and the fix, where litdata would fail late or not at all: its
    S3 client retries 1,000 times, inside DataLoader workers. Checks s3:// by listing the prefix (what the shard
    command does first): credentials found and accepted, the bucket there and allowed, the endpoint answering.
    `options` are the storage options beside `key` (data.input_dir: data.storage_options)."""
    scheme = urlparse(url).scheme
    options_key = f"{key.rpartition('.')[0]}.storage_options".lstrip(".")
    options = storage_options(url, options, options_key)
    if scheme != "s3":
        return
    import boto3
    from botocore import exceptions
    from botocore.config import Config

    bucket, prefix = urlparse(url).netloc, urlparse(url).path.lstrip("/")
    if not bucket:
        raise ValueError(f"{key}={url} names no bucket; write s3://<bucket>/<prefix>")
    config = Config(connect_timeout=5, read_timeout=30, retries={"total_max_attempts": 2})
    client = boto3.client("s3", config=config, **options)
    endpoint = client.meta.endpoint_url
    try:
        client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except exceptions.NoCredentialsError:
        raise PermissionError(
            f"{key}={url}: no credentials found for {endpoint}; {AWS_CREDENTIALS}"
        ) from None
    except (exceptions.ConnectionError, exceptions.HTTPClientError) as error:  # refused, timed out
        raise ConnectionError(
            f"{key}={url}: the endpoint {endpoint} does not answer ({type(error).__name__}); start the server, or "
            f"set the right one in AWS_ENDPOINT_URL or {options_key}.endpoint_url"
        ) from None
    except exceptions.ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if code == "NoSuchBucket":
            raise FileNotFoundError(
                f"{key}={url}: there is no bucket {bucket} at {endpoint}; create it, or correct {key}"
            ) from None
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"):
            raise PermissionError(
                f"{key}={url}: {endpoint} rejects the credentials ({code}); correct AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or the ~/.aws/credentials profile) for this endpoint"
            ) from None
        if code in ("AccessDenied", "AllAccessDisabled"):
            raise PermissionError(
                f"{key}={url}: access to bucket {bucket} at {endpoint} is denied to these credentials ({code}); "
                "grant them list and read access (and write access for the shard command), or use other ones"
            ) from None
        message = " ".join(str(error).split())
        raise ValueError(f"{key}={url}: {endpoint} answered {message}") from None


class Boto3Downloader(Downloader):
    """Fetches s3:// files for litdata with boto3, through litdata's own S3 client (so with the same options,
    endpoint and credentials). litdata 0.2.76's S3Downloader fetches chunks (and optimize uploads them) with
    obstore, whose client refuses plain-http endpoints such as a MinIO on a lab network or the tests' moto
    server; with this downloader litdata uploads through boto3 too. One client for every endpoint, so the
    tests' server exercises the path a run on S3 takes."""

    def __init__(
        self, remote_dir: str, cache_dir: str, chunks: list, options: dict | None = None, **kwargs: Any
    ):
        super().__init__(remote_dir, cache_dir, chunks, options)
        self.s3 = S3Client(storage_options=dict(options or {}), session_options=kwargs.get("session_options"))

    def download_file(self, remote_filepath: str, local_filepath: str) -> None:
        """Fetch the file unless the cache has it; publish it whole (renamed into place), never half-written."""
        if os.path.exists(local_filepath):
            return
        os.makedirs(os.path.dirname(local_filepath) or ".", exist_ok=True)
        url = urlparse(remote_filepath)
        partial = f"{local_filepath}.{os.getpid()}.partial"  # two workers that want it at once both fetch it
        self.s3.client.download_file(url.netloc, url.path.lstrip("/"), partial)
        os.replace(partial, local_filepath)


register_downloader("s3://", Boto3Downloader, overwrite=True)
