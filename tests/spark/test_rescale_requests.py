"""Rescale requests through the checkpoint root (Spark Connect's channel from the client to the server's driver):
the documented format against the bytes written, the newest request wins, every request read is deleted, a file
of another version is left alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

from spate.fs import CheckpointStorage
from spate.spark.rescale_requests import REQUESTS_DIR, RescaleRequest, RescaleRequests


def test_the_documented_request_is_what_send_writes(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    path = RescaleRequests(storage).send(RescaleRequest(3, "requested"))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    example = re.search(r"## Rescale requests.*?```json\n(.*?)\n```", doc, re.S).group(1)  # type: ignore[union-attr]
    assert storage.read(path).decode() == example
    assert re.fullmatch(r"_requests/rescale-\d{20}-[0-9a-f]{8}\.json", path)


def test_the_newest_request_wins_and_every_request_read_goes(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    requests = RescaleRequests(storage)
    assert requests.take() is None  # no directory yet
    for p in (2, 5, 4):
        requests.send(RescaleRequest(p, f"to {p}"))
    storage.write(f"{REQUESTS_DIR}/rescale-99999999999999999999-ffffffff.json",
                  json.dumps({"format_version": 2, "parallelism": 9}).encode())
    assert requests.take() == RescaleRequest(4, "to 4")
    assert [p for p, _ in storage.list_files(REQUESTS_DIR)] == [
        f"{REQUESTS_DIR}/rescale-99999999999999999999-ffffffff.json"]  # another version's: left alone
    assert requests.take() is None
