"""A new query's initial state on a Spark Connect session, staged in the checkpoint root.

On Connect the batch job is built in the server's ``foreachBatch`` process, which cannot receive the client's
DataFrame (a Connect DataFrame is a plan bound to the client's session). So ``start()`` of a query without a
checkpoint has Spark write the initial state as Parquet into ``<root>/_initial/<run>/`` (on the server, where
the root is) and hands the server's driver that location: its first batch reads it and routes its rows like the
input's, as in classic mode. Once the query has a checkpoint the staged copy is no longer read (the state is in
the checkpoints) and the client deletes it, the files Spark's Parquet writer left there only.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from pyspark.errors import AnalysisException

from spate.errors import SettingError
from spate.fs import CheckpointStorage, join_uri
from spate.layout import INITIAL_DIR, is_staged_initial_file, staged_initial_dir
from spate.spark.subtask_job import InitialState


@dataclass(frozen=True)
class StagedInitialState:
    """Where an initial state was staged (a location Spark opens) and the columns it is grouped by."""

    location: str
    key_columns: tuple[str, ...]

    @classmethod
    def stage(cls, initial: InitialState, root: str) -> StagedInitialState:
        """Have Spark write ``initial``'s rows below ``root`` (a root Spark opens by its path or URI).

        Raises:
            SettingError: Spark's Parquet writer refused the rows (a column of a type Parquet cannot hold, such as
                the interval of ``make_interval``); what it may have left is deleted at the next ``start()``.
        """
        df, keys = initial
        location = join_uri(root, staged_initial_dir(uuid.uuid4().hex))
        try:
            df.write.parquet(location)
        except AnalysisException as e:
            raise SettingError(
                "initial_state on a Spark Connect session is staged in the checkpoint root as Parquet, and Spark "
                f"could not write it: {str(e).splitlines()[0]}. Cast or drop the columns Parquet cannot hold (an "
                "interval of make_interval: .cast('string')), or bootstrap the state with write_savepoint and "
                "start with restore_from=") from e
        return cls(location, tuple(keys))

    def read(self, spark: Any) -> InitialState:
        """The staged rows as a DataFrame of ``spark`` (the server's session), with their key columns."""
        return spark.read.parquet(self.location), list(self.key_columns)


def remove_staged_initial_states(storage: CheckpointStorage) -> None:
    """Delete what Spark wrote for staged initial states under the root (nothing else), and the directories
    this leaves empty."""
    for rel, _size in storage.list_files(INITIAL_DIR):
        if is_staged_initial_file(rel):
            storage.delete(rel)
    storage.remove_empty_dirs(INITIAL_DIR)
