"""Input for Spark's file source: one JSON-lines file per micro-batch, read oldest first."""

from __future__ import annotations

import json
import os


def write_files(directory, batches, start=0):
    os.makedirs(directory, exist_ok=True)
    for i, rows in enumerate(batches, start):
        path = os.path.join(directory, f"part-{i:05d}.json")
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(r) for r in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the file source reads oldest first
