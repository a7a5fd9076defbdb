"""``spate fuzz``: a crash-fuzz campaign for the in-process runner.

Every trial runs a seeded random job (:class:`spate_tools.campaigns.model_job.ModelJob`: value, list, map, reducing,
aggregating and TTL state, processing-time timers, operator state; outputs to a sink that appends to a file) in
a *child process*. The child kills itself with SIGKILL at a chosen protocol step (fault injection: it wraps,
from outside, the runner's steps and methods of the coordinator, subtasks, changelog and file merging), or the
parent kills it at a random moment. After each kill the job restarts on the same checkpoint root with new
random switches (parallelism, table, changelog, file merging) until it has processed every batch. Then its
sink deliveries (deduplicated by batch id: a batch delivered twice must be delivered equal), its final
checkpointed state and its operator state are compared with a crash-free reference run and with the plain
model (:class:`spate_tools.campaigns.model_job.Model`), and every retained checkpoint is verified. With
``--sink parquet|delta|iceberg`` the outputs go to a table sink instead, the kills include the steps of its
commit, and the table must hold every batch's outputs exactly once (:mod:`spate_tools.campaigns.table_sinks`).

Engine-agnostic: LocalRunner only, nothing here imports ``spate.spark``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from spate.changelog.process_view import ProcessView, ThreadView
from spate.changelog.state import ChangelogConfig
from spate.changelog.upload import BatchingUploadScheduler, UploadConfig
from spate.checkpoint.cleanup import RootCleanup
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.checkpoint.inspect import (
    keyed_state_entries,
    keyed_state_names,
    load_checkpoint,
    operator_state_elements,
    verify_checkpoint,
)
from spate.checkpoint.janitor import Janitor
from spate.errors import SpateError
from spate.filemerging.config import FileMergingConfig
from spate.filemerging.manager import PooledWriter
from spate.fs import CheckpointStorage
from spate.layout import METADATA_FILE
from spate.report import format_table
from spate.runtime.local import LocalRunner
from spate.runtime.recovery import storage as recovery_storage
from spate.runtime.subtask import Subtask
from spate.sinks import DeltaSink, IcebergSink, ParquetSink, TableSink
from spate_tools.campaigns import driver_races
from spate_tools.campaigns.model_job import OPS, Model, ModelJob
from spate_tools.campaigns.table_sinks import KINDS as TABLE_KINDS
from spate_tools.campaigns.table_sinks import SCHEMA as TABLE_SCHEMA
from spate_tools.campaigns.table_sinks import TableRows, expected_rows, make_sink, read_table

MAX_PARALLELISM = 32
MAX_ROWS = 12
KEYS = [*(f"k{i}" for i in range(16)), "ü", "", "日本語", "a\x00b"]  # one type: a Spark key column has one
# materialize every ~2 batches (1000 ms apart): restarts land in the middle of materializations
CHANGELOG = ChangelogConfig(materialization_interval_ms=1500, upload=UploadConfig(persist_delay_s=0.0))
# small physical files, so they fill up, roll over and get wasteful enough for space control to act
MERGING: dict[str, Any] = {"off": False, **{m: FileMergingConfig(m, max_file_size=6000) for m in ("within", "across")}}
CHILD_TIMEOUT_S = 300.0
STARTUP_S = 0.3  # a child needs about this long to import spate: random kills land after it
MAX_FAILED_IN_A_ROW = 3

# step -> what has happened when the child dies there
STEPS = {
    "takeover": "a driver claimed the root (a new epoch), before orphan cleanup",
    "restore": "a subtask restored its state",
    "after_begin": "the checkpoint is planned, no subtask has run",
    "process": "a subtask processed its rows, before its snapshot",
    "after_subtask": "a subtask's snapshot is durable, before its ack",
    "segment": "a segment was appended to a merged physical file",
    "upload": "a change file is written, before the upload completes",
    "materialize": "a background materialization wrote its file, before it is used",
    "after_acks": "every subtask acknowledged, before the metadata",
    "before_metadata": "the metadata is about to be written",
    "after_metadata": "the metadata is written, before registration and subsumption",
    "subsume": "an old checkpoint's metadata is deleted, its files not yet",
    "discard": "a physical file no retained checkpoint needs was deleted",
    "after_complete": "the checkpoint is complete, before the sink",
    "sink": "the sink wrote the batch, before returning",
    "after_sink_before_mark": "the sink returned, before the delivery mark",
    "after_sink": "the batch is delivered and marked",
    "commit_move": "a table sink's commit moved a staged data file into place, before the others",
    "commit_table": "a table sink's commit moved the batch's files, before the table records them",
}
PER_SUBTASK = {"restore", "process", "after_subtask", "segment", "upload", "materialize", "commit_move"}
NEEDS = {"upload": "changelog", "materialize": "changelog", "segment": "merging", "commit_move": "table",
         "commit_table": "table"}
RANDOM_TIME = "random_time"


def now_of(batch_id: int) -> int:
    """The processing time of a batch: 1000 ms apart, so TTLs and timers expire on a known batch."""
    return 1000 * (batch_id + 1)


def job_batches(seed: int, batches: int) -> list[list[dict]]:
    """The deterministic input of a trial's job: ``batches`` non-empty batches of state operations."""
    rng = random.Random(seed)
    out, i = [], 0
    for _ in range(batches):
        rows = []
        for _ in range(rng.randint(1, MAX_ROWS)):
            rows.append({"k": rng.choice(KEYS), "op": rng.choice(OPS), "x": rng.randint(-50, 50), "i": i})
            i += 1
        out.append(rows)
    return out


def normalized(rows: list[dict]) -> list[str]:
    """One batch's outputs, order-free and comparable across serialization (repr of sorted items)."""
    return sorted(repr(sorted(r.items())) for r in rows)


@dataclass
class Switches:
    """What may change on every restart."""

    parallelism: int = 1
    table: str = "heap"
    changelog: bool = False
    merging: str = "off"

    @staticmethod
    def draw(rng: random.Random) -> Switches:
        return Switches(rng.randint(1, 6), rng.choice(["heap", "lmdb"]), rng.random() < 0.5,
                        rng.choice(list(MERGING)))

    def has(self, feature: str, sink: str = "file") -> bool:
        if feature == "table":
            return sink != "file"
        return self.changelog if feature == "changelog" else self.merging != "off"

    def __str__(self) -> str:
        return (f"p={self.parallelism} {self.table} changelog={'on' if self.changelog else 'off'} "
                f"merging={self.merging}")


@dataclass
class KillPoint:
    """Die at the ``skip + 1``-th time ``step`` is reached while processing batch ``batch`` or later
    (``batch`` -1: also during start-up)."""

    step: str
    batch: int = -1
    skip: int = 0


# -- the child: one run of the job until it ends or dies --------------------------------------------------------
class FaultInjector:
    """Fault injection for the crash campaign: counts how often the kill point's step is reached and SIGKILLs
    this process there. Hooks in from outside: the runner's ``fault_injector`` and wrappers around library
    methods (installed in the child process only)."""

    def __init__(self, point: KillPoint | None) -> None:
        self.point = point
        self.batch = -1
        self._hits = 0
        self._lock = threading.Lock()

    def hit(self, step: str) -> None:
        p = self.point
        if p is None or step != p.step or (self.batch < p.batch and step != "takeover"):
            return
        with self._lock:
            self._hits += 1
            if self._hits > p.skip:
                os.kill(os.getpid(), signal.SIGKILL)

    def runner_step(self, step: str, batch_id: int) -> None:
        """LocalRunner's fault_injector: ``after_subtask_<i>`` counts as ``after_subtask``."""
        self.batch = batch_id
        self.hit("after_subtask" if step.startswith("after_subtask_") else step)

    def install(self) -> None:
        self._wrap(RootCleanup, "remove_orphans", before="takeover")
        self._wrap(recovery_storage, "restore", after="restore")
        self._wrap(Subtask, "_process", after="process")
        self._wrap(PooledWriter, "write", after="segment")
        self._wrap(BatchingUploadScheduler, "_completed", before="upload")
        for view in (ThreadView, ProcessView):  # a materialization read in a thread or by a reader process
            self._wrap(view, "write", after="materialize")
        self._wrap(CheckpointStorage, "create_exclusive", before="before_metadata", after="after_metadata",
                   only=lambda args: str(args[1]).endswith(METADATA_FILE))
        self._wrap(Janitor, "drop_checkpoint", after="subsume")
        self._wrap(Janitor, "delete_file", after="discard")
        self._wrap(CheckpointStorage, "move", after="commit_move")
        self._wrap(TableSink, "commit", after="sink")
        for sink in (ParquetSink, DeltaSink, IcebergSink):
            self._wrap(sink, "_commit_files", before="commit_table")

    def _wrap(self, owner: Any, name: str, before: str | None = None, after: str | None = None,
              only: Callable[[tuple], bool] = lambda args: True) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if before and only(args):
                self.hit(before)
            result = original(*args, **kwargs)
            if after and only(args):
                self.hit(after)
            return result

        setattr(owner, name, wrapper)


class FileSink:
    """Appends ``{"batch": id, "rows": [...]}`` lines to a file, one write per delivery."""

    def __init__(self, path: str, injector: FaultInjector) -> None:
        self.path, self.injector = path, injector

    def __call__(self, rows: list[dict], batch_id: int) -> None:
        line = json.dumps({"batch": batch_id, "rows": normalized(rows)}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        self.injector.hit("sink")


def run_child(spec: dict[str, Any]) -> None:
    """Run the job of ``spec`` from the root's latest checkpoint to its last batch (or die on the way)."""
    point = KillPoint(**spec["kill"]) if spec.get("kill") else None
    injector = FaultInjector(point)
    injector.install()
    switches = Switches(**spec["switches"])
    batches = job_batches(spec["seed"], spec["batches"])
    clock = [0]
    kind = spec.get("sink_kind", "file")
    table_out = {"sink": make_sink(kind, spec["table"]), "output_schema": TABLE_SCHEMA} if kind != "file" else \
        {"sink": FileSink(spec["sink"], injector)}
    runner = LocalRunner(ModelJob if kind == "file" else TableRows, key="k", checkpoint_root=spec["root"],
                         parallelism=switches.parallelism, max_parallelism=MAX_PARALLELISM, table=switches.table,
                         local_dir=spec["local_dir"], **table_out, clock=lambda: clock[0],
                         fault_injector=injector.runner_step, changelog=CHANGELOG if switches.changelog else False,
                         file_merging=MERGING[switches.merging])
    start = runner.next_batch_id
    for n in range(start, len(batches)):
        clock[0], injector.batch = now_of(n), n
        rows = batches[n]
        if spec.get("bug") and n == start > 0:  # the deliberately broken variant: loses an update on restore
            rows = rows[1:]
        runner.run_batch(n, rows)
    runner.close()


# -- the parent: trials, kills, restarts ------------------------------------------------------------------------
@dataclass
class Tally:
    """The campaign's figures so far."""

    seed: int
    trials: int = 0
    kills: int = 0
    kills_by_step: Counter = field(default_factory=Counter)
    restarts: int = 0
    missed: int = 0  # kill points the job finished without reaching
    failed_restarts: int = 0
    children: int = 0
    child_seconds: float = 0.0
    problems: list[dict[str, Any]] = field(default_factory=list)

    def mean_child_seconds(self) -> float:
        return self.child_seconds / self.children if self.children else 2.0

    def divergences(self) -> int:
        return len({p["trial_seed"] for p in self.problems if p["kind"] == "divergence"})


@dataclass
class Trial:
    """One trial's job and where its runs write."""

    seed: int
    batches: int
    workdir: str
    bug: bool = False
    sink: str = "file"  # or a table sink's kind (:data:`spate_tools.campaigns.table_sinks.KINDS`)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def paths(self, run: str) -> dict[str, str]:
        base = os.path.join(self.workdir, run)
        os.makedirs(os.path.join(base, "local"), exist_ok=True)
        return {"root": os.path.join(base, "root"), "local_dir": os.path.join(base, "local"),
                "sink": os.path.join(base, "sink.jsonl"), "table": os.path.join(base, "table")}


def spawn_child(spec: dict[str, Any], kill_after_s: float | None, tally: Tally) -> tuple[int, str]:
    """Run one child; SIGKILL it after ``kill_after_s`` if given. Returns its exit code and stderr."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "spate_tools.campaigns.fuzz", json.dumps(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=kill_after_s if kill_after_s is not None else CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
        if kill_after_s is None:
            return 1, f"hung for {CHILD_TIMEOUT_S:.0f} s"
    if proc.returncode == 0:
        tally.children += 1
        tally.child_seconds += time.perf_counter() - started
    return proc.returncode, err


def choose_kill(trial: Trial, switches: Switches, next_batch: int, random_share: float) -> KillPoint:
    """A protocol step the child dies at, or (with ``random_share``) :data:`RANDOM_TIME`: the parent kills."""
    rng = trial.rng
    if rng.random() < random_share:
        return KillPoint(RANDOM_TIME)
    step = rng.choice([s for s in STEPS if s not in NEEDS or switches.has(NEEDS[s], trial.sink)])
    batch = -1 if rng.random() < 0.15 else rng.randint(min(next_batch, trial.batches - 1), trial.batches - 1)
    skip = rng.randint(0, switches.parallelism - 1) if step in PER_SUBTASK else 0
    return KillPoint(step, batch, skip)


def next_batch_of(root: str) -> int:
    ids = list_complete_checkpoints(CheckpointStorage(root)) if os.path.isdir(root) else []
    return ids[-1] + 1 if ids else 0


def run_with_kills(trial: Trial, run: str, kills: int, random_share: float, tally: Tally) -> bool:
    """Run the trial's job to its end on a fresh root, killed up to ``kills`` times; False if it could not
    finish (restarts failed too often)."""
    paths = trial.paths(run)
    failed_in_a_row, segments = 0, 0
    while True:
        switches = Switches.draw(trial.rng)
        point = choose_kill(trial, switches, next_batch_of(paths["root"]), random_share) if kills else None
        at_random = point is not None and point.step == RANDOM_TIME
        spec = {**paths, "seed": trial.seed, "batches": trial.batches, "switches": asdict(switches),
                "kill": asdict(point) if point and not at_random else None, "bug": trial.bug,
                "sink_kind": trial.sink}
        delay = trial.rng.uniform(STARTUP_S, max(STARTUP_S, tally.mean_child_seconds())) if at_random else None
        code, err = spawn_child(spec, delay, tally)
        if segments:
            tally.restarts += 1
        segments += 1
        if code == -signal.SIGKILL and point is not None:
            kills -= 1
            tally.kills += 1
            tally.kills_by_step[point.step] += 1
            continue
        if code == 0:
            tally.missed += point is not None
            return True
        failed_in_a_row += 1
        tally.failed_restarts += 1
        tally.problems.append({"kind": "failed_restart", "trial_seed": trial.seed, "switches": str(switches),
                               "detail": _last_lines(err) or f"exit code {code}"})
        if failed_in_a_row >= MAX_FAILED_IN_A_ROW:
            return False


def _last_lines(text: str, n: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:])


# -- comparison -------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a run left behind: sink deliveries per batch, the final checkpointed state and its problems."""

    deliveries: dict[int, list[list[str]]]
    checkpoint_id: int
    state: dict[str, dict[Any, Any]]
    operator: list[tuple[int, int]]
    damaged: list[str]


def read_deliveries(path: str) -> dict[int, list[list[str]]]:
    out: dict[int, list[list[str]]] = defaultdict(list)
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):  # a line without its end was cut by a kill, and is delivered again
                record = json.loads(line)
                out[record["batch"]].append(record["rows"])
    return out


def read_outcome(paths: dict[str, str], state_names: list[str], sink: str = "file") -> Outcome:
    storage = CheckpointStorage(paths["root"])
    damaged = [f"checkpoint {n}: {p}" for n in list_complete_checkpoints(storage)
               for p in verify_checkpoint(storage, load_checkpoint(storage, n))]
    meta = load_checkpoint(storage)
    now = now_of(meta.checkpoint_id)
    state = {name: checkpointed(storage, meta, name, now) for name in state_names}
    operator = [(b, i) for per in operator_state_elements(storage, meta, "batches-seen") for b, i in per]
    deliveries = read_deliveries(paths["sink"]) if sink == "file" else read_table(sink, paths["table"])
    return Outcome(deliveries, meta.checkpoint_id, state, operator, damaged)


def checkpointed(storage: CheckpointStorage, meta: Any, name: str, now: int) -> dict[Any, Any]:
    """State ``name`` of checkpoint ``meta`` as the model holds it: key -> value (map: dict, timers: set)."""
    got: dict[Any, Any] = {}
    if name not in keyed_state_names(meta) and not name.startswith("timers:"):
        return got  # no key ever had a value
    for e in keyed_state_entries(storage, meta, name, now_ms=now):
        if name == "map":
            got.setdefault(e.key, {})[e.user_key] = e.value
        elif name.startswith("timers:"):
            got.setdefault(e.key, set()).add(e.user_key)
        elif e.key in got:
            got[e.key] = ("appears twice", got[e.key], e.value)
        else:
            got[e.key] = e.value
    return got


def expected(trial: Trial) -> tuple[list[list[str]], dict[str, dict[Any, Any]]]:
    """The model's outputs per batch and the state the last checkpoint must hold."""
    model = Model()
    as_delivered = normalized if trial.sink == "file" else expected_rows
    outputs = [as_delivered(model.batch(rows, now_of(n))) for n, rows in enumerate(job_batches(trial.seed,
                                                                                                 trial.batches))]
    return outputs, model.checkpointed(now_of(trial.batches - 1))


def compare(trial: Trial, got: Outcome, ref: Outcome) -> list[str]:
    """Every way the crashed run differs from the model or the crash-free reference."""
    outputs, state = expected(trial)
    problems = got.damaged + [f"reference run: {p}" for p in ref.damaged]
    if got.checkpoint_id != trial.batches - 1:
        problems.append(f"latest checkpoint is {got.checkpoint_id}, expected {trial.batches - 1}")
    for n, want in enumerate(outputs):
        deliveries = got.deliveries.get(n)
        if not deliveries:
            problems.append(f"batch {n} never reached the sink")
        elif any(d != want for d in deliveries):
            problems.append(f"batch {n}: {len(deliveries)} deliveries, not all equal to the model's outputs")
        elif deliveries[0] != ref.deliveries.get(n, [None])[0]:
            problems.append(f"batch {n}: outputs differ from the crash-free reference")
    for name, want_state in state.items():
        if got.state[name] != want_state:
            problems.append(f"checkpointed state {name!r} differs from the model")
        elif got.state[name] != ref.state[name]:
            problems.append(f"checkpointed state {name!r} differs from the crash-free reference")
    problems += operator_problems(got.operator, trial.batches)
    return problems


def operator_problems(elements: list[tuple[int, int]], batches: int) -> list[str]:
    """Each batch added (batch, subtask) once per subtask of the run that completed it: 0..p-1 exactly once."""
    by_batch: dict[int, list[int]] = defaultdict(list)
    for b, i in elements:
        by_batch[b].append(i)
    return [f"operator state of batch {n}: subtasks {sorted(by_batch[n])}" for n in range(batches)
            if sorted(by_batch[n]) != list(range(len(by_batch[n]))) or not by_batch[n]]


# -- the campaign -----------------------------------------------------------------------------------------------
@dataclass
class CampaignOptions:
    seed: int = 0
    trials: int | None = 10
    minutes: float | None = None
    kills_per_trial: int = 4
    batches: int = 8
    random_share: float = 0.2
    workdir: str | None = None
    bug: bool = False
    sink: str = "file"


def run_trial(opts: CampaignOptions, seed: int, workdir: str, tally: Tally) -> list[str]:
    """One trial: reference run, crashed run, comparison. Returns the divergences found."""
    trial = Trial(seed, opts.batches, os.path.join(workdir, f"trial-{seed}"), opts.bug, opts.sink)
    names = list(Model().checkpointed(0))
    if not run_with_kills(trial, "reference", 0, 0.0, tally):
        return ["the crash-free reference run failed"]
    if not run_with_kills(trial, "crashed", opts.kills_per_trial, opts.random_share, tally):
        return [f"the job could not finish: {MAX_FAILED_IN_A_ROW} restarts in a row failed"]
    try:
        ref = read_outcome(trial.paths("reference"), names, trial.sink)
        got = read_outcome(trial.paths("crashed"), names, trial.sink)
    except (SpateError, OSError) as e:
        return [f"reading the result failed: {e}"]
    return compare(trial, got, ref)


def run_campaign(opts: CampaignOptions, progress: Callable[[str], None]) -> Tally:
    tally = Tally(opts.seed)
    workdir = opts.workdir or tempfile.mkdtemp(prefix="spate-fuzz-")
    deadline = time.monotonic() + opts.minutes * 60 if opts.minutes is not None else None
    while opts.trials is None or tally.trials < opts.trials:
        if deadline is not None and time.monotonic() >= deadline:
            break
        seed = opts.seed + tally.trials
        kills, failed, started = tally.kills, tally.failed_restarts, time.perf_counter()
        problems = run_trial(opts, seed, workdir, tally)
        tally.trials += 1
        for p in problems:
            tally.problems.append({"kind": "divergence", "trial_seed": seed, "detail": p})
        verdict = "ok" if not problems else f"DIVERGED ({len(problems)}): {problems[0]}"
        progress(f"trial {tally.trials} seed {seed}: {tally.kills - kills} kills, "
                 f"{tally.failed_restarts - failed} failed restarts, {verdict} ({time.perf_counter() - started:.1f} s)")
        if not problems:
            shutil.rmtree(os.path.join(workdir, f"trial-{seed}"), ignore_errors=True)
    if opts.workdir is None and not tally.problems:
        shutil.rmtree(workdir, ignore_errors=True)
    elif tally.problems:
        progress(f"the failing trials' files are under {workdir}")
    return tally


def summary(tally: Tally, seconds: float, sink: str = "file") -> dict[str, Any]:
    return {"campaign": "crash", "sink": sink, "seed": tally.seed, "trials": tally.trials, "kills": tally.kills,
            "kills_by_step": {s: tally.kills_by_step[s] for s in [*STEPS, RANDOM_TIME] if tally.kills_by_step[s]},
            "restarts": tally.restarts, "kill_points_missed": tally.missed, "divergences": tally.divergences(),
            "failed_restarts": tally.failed_restarts, "seconds": round(seconds, 1), "problems": tally.problems}


def print_report(result: dict[str, Any]) -> None:
    names = ("seed", "trials", "kills", "restarts", "kill_points_missed", "divergences", "failed_restarts",
             "seconds")
    figures = [{"figure": k, "value": str(result[k]) if k == "seed" else result[k]} for k in names]
    print(format_table(figures, title="crash-fuzz campaign"))
    print()
    steps = [{"step": s, "kills": n, "what has happened": STEPS.get(s, "the parent killed at a random moment")}
             for s, n in result["kills_by_step"].items()]
    print(format_table(steps, title="kills per protocol step"))
    shown = 10
    sink = f" --sink {result['sink']}" if result.get("sink", "file") != "file" else ""
    for p in result["problems"][:shown]:
        print(f"{p['kind']} (reproduce: spate fuzz{sink} --seed {p['trial_seed']} --trials 1): {p['detail']}")
    if len(result["problems"]) > shown:
        print(f"... and {len(result['problems']) - shown} more problems (--json lists them all)")


# -- command line -----------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="campaign seed; trial i uses seed+i (default 0)")
    p.add_argument("--trials", type=int, default=None, help="number of trials (default 10, or unlimited with "
                                                            "--minutes)")
    p.add_argument("--minutes", type=float, default=None, help="start no trial after this time budget")
    p.add_argument("--kills-per-trial", type=int, default=4, help="kills per trial at most (default 4)")
    p.add_argument("--batches", type=int, default=8, help="batches per job (default 8)")
    p.add_argument("--random-share", type=float, default=0.2, help="share of kills at a random moment instead of "
                                                                   "a protocol step (default 0.2)")
    p.add_argument("--sink", default="file", choices=["file", *TABLE_KINDS],
                   help="where outputs go: a file the sink appends to (default; each batch at least once), or a "
                        "table sink, compared exactly once")
    p.add_argument("--dir", default=None, help="working directory (default: a temporary one; kept on failure)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--drivers", type=int, default=0, metavar="N",
                   help="instead: N races of each kind (simultaneous, staggered, three, paused) of driver "
                        "processes on one root, counting shared epochs, double commits, lost checkpoints and "
                        "failed restarts")
    p.add_argument("--inject-bug", action="store_true", help=argparse.SUPPRESS)  # proves the comparator works


def run_from_args(args: argparse.Namespace) -> int:
    """``spate fuzz``: progress on stderr, the report (or ``--json``) on stdout; exit 1 on any divergence or
    failed restart."""
    if args.drivers:
        return driver_races.run_from_args(args.drivers, args.seed, args.json)
    trials = 10 if args.trials is None and args.minutes is None else args.trials
    opts = CampaignOptions(args.seed, trials, args.minutes, args.kills_per_trial, args.batches, args.random_share,
                           args.dir, args.inject_bug, args.sink)
    if opts.batches < 1 or opts.kills_per_trial < 0:
        raise ValueError("--batches must be >= 1 and --kills-per-trial >= 0")
    started = time.perf_counter()
    tally = run_campaign(opts, lambda line: print(line, file=sys.stderr, flush=True))
    result = summary(tally, time.perf_counter() - started, opts.sink)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)
    return 1 if tally.problems else 0


if __name__ == "__main__":  # a child of the campaign: python -m spate_tools.campaigns.fuzz '<spec as JSON>'
    run_child(json.loads(sys.argv[1]))
