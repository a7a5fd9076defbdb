"""Running Spark's own streaming query, the reference a side-by-side test compares spate with: ``drain``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pyspark.errors import StreamingQueryException

# Spark plans the first batch of each run of a transformWithState query with a Python worker started on the
# driver (TransformWithStateInPySparkPythonPreInitRunner, a "simple" worker), and waits a hard-coded 10 s for it to
# connect back. On a loaded 2-core machine it sometimes does not (measured: eight such workers started within a few
# seconds each took over 10 s to connect, every one of them failed), and the query fails while it plans that batch,
# before the batch's sink runs.
CONNECT_BACK = "Python worker failed to connect back"


def drain(start: Callable[[], Any], attempts: int = 3, pause_s: float = 5.0) -> Any:
    """Start Spark's query with ``start()``, process all its available input, stop it, and return it.

    A run that failed because Spark's driver-side Python worker did not connect back in time (``CONNECT_BACK``) is
    started again from its checkpoint, as a user restarts a failed query, after a pause that grows with each attempt
    (``pause_s`` times the attempt: started again at once, it meets the same load), up to ``attempts`` runs in all.
    The failure is the machine's load, not the query's, and nothing of that batch reached the sink. Any other
    failure is raised as it is."""
    for attempt in range(1, attempts + 1):
        query = start()
        try:
            query.processAllAvailable()
            return query
        except StreamingQueryException as failure:
            if CONNECT_BACK not in str(failure) or attempt == attempts:
                raise
        finally:
            query.stop()
        time.sleep(pause_s * attempt)
    raise ValueError(f"drain needs at least one attempt, not {attempts}")
