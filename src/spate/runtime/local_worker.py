"""The worker process of the in-process runner's subtasks: what a :class:`~spate.runtime.local.LocalRunner` owns
as the worker its subtasks run in, as a Spark executor's Python worker does for a stream's (there:
:class:`spate.spark.task.WorkerSubtasks`)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence

from spate.checkpoint.protocol import SubtaskPlan
from spate.runtime.batch import KeyedBatch
from spate.runtime.local_input import Routed
from spate.runtime.localstate import remove_other_parallelisms
from spate.runtime.services import WorkerServices
from spate.runtime.subtask import BatchOutput, ProcessorFactory, Subtask, SubtaskConfig


class LocalWorker:
    """The subtasks of one query at its current parallelism, their settings (``config``), their
    :class:`WorkerServices` for the checkpoint root ``uri``, and ``temp_local_dir``: a directory made for their
    lmdb state when none was given, deleted on :meth:`close` (an explicit ``local_dir`` stays, for a later
    runner to reuse the state in it)."""

    def __init__(self, factory: ProcessorFactory, config: SubtaskConfig, uri: str, *,
                 temp_local_dir: str | None = None) -> None:
        self._factory = factory
        self.config = config
        self.services = WorkerServices(uri, config.file_merging, config.changelog)
        self._temp_local_dir = temp_local_dir
        self.subtasks: list[Subtask] = []

    def serve(self, parallelism: int) -> None:
        """Run the query at ``parallelism`` subtasks from now on: those of another parallelism are closed (their
        lmdb state stays on disk, where the new subtasks build theirs from)."""
        if self.subtasks and len(self.subtasks) == parallelism:
            return
        for subtask in self.subtasks:
            subtask.close()
        self.subtasks = [Subtask(i, parallelism, self._factory, self.config, self.services)
                         for i in range(parallelism)]

    def start(self, plans: list[SubtaskPlan], routed: Routed,
              initial: Sequence[KeyedBatch | None]) -> list[Callable[[], BatchOutput]]:
        """Every planned subtask processes its rows (``routed[i]``, and ``initial[i]`` of the initial state) and
        starts its snapshot before any waits: their changelog uploads share the persist delay and one file, as
        parallel tasks of one worker would. Returns, in plan order, the functions that wait for each."""
        return [self.subtasks[plan.index].start(plan, routed[plan.index], initial[plan.index]) for plan in plans]

    def remove_other_parallelisms(self, query_id: str, parallelism: int) -> None:
        """Local lmdb directories of another parallelism than ``parallelism`` can never be reused: delete them."""
        if self.config.table != "lmdb" or not self.config.local_dir:
            return
        remove_other_parallelisms(self.config.local_dir, query_id, parallelism)

    def close(self, latest_completed: int | None) -> None:
        """Close every subtask, then the services (``latest_completed``: the newest checkpoint known complete),
        then delete the temporary local directory, if one was made."""
        for subtask in self.subtasks:
            subtask.close()
        self.services.close(latest_completed)
        if self._temp_local_dir is not None:
            shutil.rmtree(self._temp_local_dir, ignore_errors=True)
