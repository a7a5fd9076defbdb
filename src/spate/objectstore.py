"""Conditional writes on object stores, which ``pyarrow.fs`` cannot send.

S3 (and S3-compatible servers) create an object only if none exists when the PUT carries
``If-None-Match: *``; exactly one of several racing writers succeeds. spate needs this for the few files whose
creation is a decision (the epoch a driver claims, a checkpoint's metadata). The client is boto3, configured
from the same URI options ``pyarrow.fs`` reads (``endpoint_override``, ``scheme``, ``region``,
``access_key``, ``secret_key``, ``session_token``); credentials otherwise come from the usual AWS chain.
"""

from __future__ import annotations

import functools
import time
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from spate.errors import MissingPackageError

_EXISTS = {"PreconditionFailed", "412"}
_CONFLICT = {"ConditionalRequestConflict", "409"}  # another conditional write of the key is in flight: retry
_CONFLICT_RETRIES = 5


def put_if_absent(uri: str, full_path: str, data: bytes) -> bool:
    """Create the object ``full_path`` ("bucket/key") of the store ``uri`` names, unless it exists.

    Returns True when the store supports conditional creation (S3) and the write was decided by it; raises
    ``FileExistsError`` when the object exists. Returns False for stores without conditional writes, so the
    caller falls back to a best-effort check."""
    scheme = urlsplit(uri).scheme
    if scheme not in ("s3", "s3a"):
        return False
    bucket, _, key = full_path.partition("/")
    client = _s3_client(_client_options(uri))
    for attempt in range(_CONFLICT_RETRIES + 1):
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            return True
        except Exception as e:  # botocore's ClientError, without importing botocore at module load
            code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
            if code in _EXISTS or (code in _CONFLICT and attempt == _CONFLICT_RETRIES):
                raise FileExistsError(full_path) from e
            if code not in _CONFLICT:
                raise
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


def _client_options(uri: str) -> tuple[tuple[str, str], ...]:
    """The URI's query options, plus credentials given as ``s3://KEY:SECRET@bucket/...`` (as pyarrow reads
    them)."""
    parts = urlsplit(uri)
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.username:
        options.setdefault("access_key", unquote(parts.username))
        options.setdefault("secret_key", unquote(parts.password or ""))
    return tuple(sorted(options.items()))


@functools.lru_cache(maxsize=16)
def _s3_client(options: tuple[tuple[str, str], ...]) -> Any:
    """One boto3 client per set of URI options and process (clients are thread-safe and costly to make)."""
    try:
        import boto3
    except ImportError as e:
        raise MissingPackageError("checkpoints on S3 need boto3 for conditional writes (If-None-Match), which "
                                  "pyarrow.fs cannot send: pip install 'spate[s3]' (or boto3)") from e
    opts = dict(options)
    endpoint = opts.get("endpoint_override")
    if endpoint and "://" not in endpoint:
        endpoint = f"{opts.get('scheme', 'https')}://{endpoint}"
    return boto3.client("s3", endpoint_url=endpoint or None, region_name=opts.get("region") or None,
                        verify=opts.get("tls_ca_file_path") or None,
                        aws_access_key_id=opts.get("access_key") or None,
                        aws_secret_access_key=opts.get("secret_key") or None,
                        aws_session_token=opts.get("session_token") or None)
