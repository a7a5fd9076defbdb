"""Settings of a stateful stream on Spark: the query's :class:`SpateSettings` (``spark.spate.*`` in the Spark
conf), and where executors keep local state."""

from __future__ import annotations

import os
import tempfile

from spate.runtime.settings import CONF_PREFIX, SpateSettings


def executor_local_dir() -> str:
    """Where executors keep lmdb state when no local_dir is set: Spark's local dir, else the temp dir."""
    base = (os.environ.get("SPARK_LOCAL_DIRS") or tempfile.gettempdir()).split(",")[0]
    return os.path.join(base, "spate-local")


__all__ = ["CONF_PREFIX", "SpateSettings", "executor_local_dir"]
