"""The property-based model test's machinery: random state operations on random keys (``batches_st``, rows of
:data:`~spate_tools.campaigns.model_job.OPS`), one checkpoint per batch, crashes at every protocol step and
restarts at random parallelism and table kind (``segment``); ``run_scenario`` runs a scenario with
:class:`~spate_tools.campaigns.model_job.ModelJob` and checks it against the plain in-memory model
(``check_against_model``). The fixed scenarios (``scenario_*``) are readable instances of the property."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from typing import Any

from hypothesis import strategies as st

from spate import LocalRunner, load_checkpoint, operator_state_elements
from spate.changelog.state import ChangelogConfig
from spate.changelog.upload import UploadConfig
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.checkpoint.inspect import verify_checkpoint
from spate.filemerging.config import FileMergingConfig
from spate.fs import CheckpointStorage
from spate_tools.campaigns.fuzz import checkpointed
from spate_tools.campaigns.model_job import OPS, Model, ModelJob

# A key column holds one type, as a Spark column does (LocalRunner refuses a mix): an example keys by one of
# these families, and the examples between them cover every key encoding (ints, strings, tuples, bytes).
KEY_FAMILIES: list[list[Any]] = [[0, 1, -7, 2**40, 17, 99], ["a", "ü", "日本語", "", "z", "k"],
                                 [(1, "x"), (2, "y"), (-7, "ü"), (3, ""), (2**40, "z")], [b"\x00k", b"k", b"\xffz"]]
CRASH_STEPS = [None, "after_begin", "after_subtask_0", "after_acks", "after_complete", "after_sink_before_mark"]


class Crash(Exception):
    """Fault injection: the process dies here."""


def rows_of(keys: list[Any]) -> st.SearchStrategy[tuple]:
    return st.tuples(st.sampled_from(keys), st.sampled_from(OPS), st.integers(-50, 50))


batches_st = st.sampled_from(KEY_FAMILIES).flatmap(
    lambda keys: st.lists(st.lists(rows_of(keys), max_size=12), min_size=1, max_size=7))
MERGING_MODES = ["off", "within", "across"]
segment = st.tuples(st.integers(1, 16), st.sampled_from(["heap", "lmdb"]), st.integers(0, 7),
                    st.sampled_from(CRASH_STEPS), st.booleans(), st.sampled_from(MERGING_MODES))
# materialize every ~2 batches (1000 ms apart), staggered: restarts land in the middle of materializations
CHANGELOG = ChangelogConfig(materialization_interval_ms=1500, upload=UploadConfig(persist_delay_s=0.0))
# small physical files, so files fill up, roll over and get wasteful enough for space control to act; small
# rewrite budgets, so that after a rescale restored segments are named where they are (within: nothing is
# re-written) or some copied and others not (across)
MERGING: dict[str, Any] = {"off": False, **{m: FileMergingConfig(m, max_file_size=6000, rewrite_budget=budget)
                                            for m, budget in (("within", 0), ("across", 600))}}


def as_rows(raw: list[list[tuple]]) -> list[list[dict]]:
    out, i = [], 0
    for batch in raw:
        rows = []
        for k, op, x in batch:
            rows.append({"k": k, "op": op, "x": x, "i": i})
            i += 1
        out.append(rows)
    return out


def normalized(rows: list[dict]) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in rows)


def now_of(batch_id: int) -> int:
    return 1000 * (batch_id + 1)


def run_scenario(raw_batches: list[list[tuple]], segments: list[tuple], final: tuple[int, str]) -> None:
    root, local_dir = tempfile.mkdtemp(prefix="model-ckpt-"), tempfile.mkdtemp(prefix="model-local-")
    try:
        _run_scenario_in(root, local_dir, as_rows(raw_batches), segments, final)
    finally:  # each hypothesis example makes two directories: leave none behind
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(local_dir, ignore_errors=True)


def _run_scenario_in(root: str, local_dir: str, batches: list[list[dict]], segments: list[tuple],
            final: tuple[int, str]) -> None:
    deliveries: dict[int, list[list[str]]] = {}
    completed_parallelism: dict[int, int] = {}
    clock = [0]

    def sink(rows: list[dict], batch_id: int) -> None:
        deliveries.setdefault(batch_id, []).append(normalized(rows))

    armed: list[tuple[str, int]] = []  # the crash to inject: (step, batch id), armed before the batch

    def fault(step: str, batch_id: int) -> None:
        if armed and (step, batch_id) == armed[0]:
            raise Crash(step)

    def runner(parallelism: int, table: str, changelog: bool, merging: str) -> LocalRunner:
        return LocalRunner(ModelJob, key="k", checkpoint_root=root, parallelism=parallelism, max_parallelism=128,
                           table=table, local_dir=local_dir, sink=sink, clock=lambda: clock[0],
                           fault_injector=fault, changelog=CHANGELOG if changelog else False,
                           file_merging=MERGING[merging])

    for parallelism, table, stop, crash_step, changelog, merging in segments:
        r = runner(parallelism, table, changelog, merging)
        start = r.next_batch_id
        stop = min(stop, len(batches))
        for n in range(start, stop):
            clock[0] = now_of(n)
            r.run_batch(n, batches[n])
            completed_parallelism[n] = parallelism
        if crash_step is not None and stop < len(batches) and stop >= start:
            armed[:] = [(crash_step, stop)]
            clock[0] = now_of(stop)
            try:
                r.run_batch(stop, batches[stop])
            except Crash:
                if crash_step in ("after_complete", "after_sink_before_mark"):
                    completed_parallelism[stop] = parallelism
            else:
                raise AssertionError("fault injector did not fire")
            finally:
                armed.clear()
        r.close()

    r = runner(*final)
    for n in range(r.next_batch_id, len(batches)):
        clock[0] = now_of(n)
        r.run_batch(n, batches[n])
        completed_parallelism[n] = final[0]
    r.close()
    check_against_model(root, batches, deliveries, completed_parallelism)


def check_against_model(root: str, batches: list[list[dict]], deliveries: dict[int, list[list[str]]],
                        completed_parallelism: dict[int, int]) -> None:
    """Every batch reached the sink with the model's outputs; every retained checkpoint is whole; the latest
    holds the model's keyed state, timers and operator state (one element per subtask and completed batch)."""
    model = Model()
    for n, rows in enumerate(batches):
        expected = normalized(model.batch(rows, now_of(n)))
        assert n in deliveries, f"batch {n} never reached the sink"
        for delivered in deliveries[n]:
            assert delivered == expected, f"batch {n}: outputs differ from the model"

    storage = CheckpointStorage(root)
    for n in list_complete_checkpoints(storage):  # every retained checkpoint is whole, not only the latest
        assert verify_checkpoint(storage, load_checkpoint(storage, n)) == [], f"checkpoint {n} is damaged"
    meta = load_checkpoint(storage)
    assert meta.checkpoint_id == len(batches) - 1
    now = now_of(meta.checkpoint_id)
    for name, want in model.checkpointed(now).items():  # a key twice, or a state missing, differs too
        assert checkpointed(storage, meta, name, now) == want, f"checkpointed state {name!r} differs from the model"

    elements = [tuple(x) for per in operator_state_elements(storage, meta, "batches-seen") for x in per]
    want_elements = Counter((b, i) for b, p in completed_parallelism.items() for i in range(p))
    assert Counter(elements) == want_elements, "operator state elements lost or duplicated"


# -- fixed scenarios ---------------------------------------------------------------------------------------------------
def scenario_rescale_up_and_down_with_crash():
    """A fixed, readable instance of the property: 2 → 16 (crash after acks) → 3 → 1."""
    raw = [[(k, op, x) for k in ("a", "b", "ü") for op, x in (("vput", b), ("ladd", b), ("mput", b),
                                                                  ("radd", b), ("aadd", b), ("timer", b))]
           for b in range(6)]
    run_scenario(raw, [(2, "lmdb", 2, None, False, "off"), (16, "heap", 3, "after_acks", True, "within"),
                       (3, "lmdb", 5, "after_complete", True, "across")], (1, "heap", False, "off"))


def scenario_changelog_throughout():
    raw = [[(k, op, x) for k in (0, 1, -7, 2**40) for op, x in (("vput", b), ("ladd", b), ("mput", b),
                                                                       ("mdel", b + 1), ("tput", b), ("timer", b))]
           for b in range(8)]
    run_scenario(raw, [(2, "heap", 3, None, True, "off"), (3, "lmdb", 5, "after_subtask_0", True, "off")],
                 (4, "heap", True, "off"))


def scenario_file_merging_across_with_rescales():
    """Changelog and merging across checkpoints throughout, with crashes and rescales 2 → 5 → 1 → 3."""
    raw = [[(k, op, x) for k in ((1, "x"), (2, "y"), (-7, "ü"), (3, ""), (4, "k")) for op, x in (
        ("vput", b), ("ladd", b), ("mput", b), ("mdel", b + 1), ("tput", b), ("timer", b))] for b in range(12)]
    run_scenario(raw, [(2, "heap", 4, None, True, "across"), (5, "lmdb", 7, "after_subtask_0", True, "across"),
                       (1, "heap", 9, "after_complete", False, "within")], (3, "lmdb", True, "across"))
