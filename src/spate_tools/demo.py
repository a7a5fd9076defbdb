"""``spate demo`` / ``make demo``: a clickstream job on the in-process runner.

It counts clicks per user and per page, stops mid-stream, restarts at another parallelism (on the other
table kind, with incremental changelog checkpoints), finishes, and checks the checkpointed state against an
independent computation.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from spate.checkpoint.inspect import keyed_state_entries, load_checkpoint, operator_state_elements, verify_checkpoint
from spate.fs import CheckpointStorage
from spate.layout import checkpoint_id_of
from spate.report import format_table, human_bytes, percentile
from spate.runtime.local import BatchResult, LocalRunner
from spate.runtime.processor import Context, Processor
from spate.state.descriptors import MapStateDescriptor, ValueStateDescriptor

CLICKS: ValueStateDescriptor[int] = ValueStateDescriptor("clicks", default=0)
PAGES = MapStateDescriptor("pages")
LAST_SEEN: ValueStateDescriptor[int] = ValueStateDescriptor("last_seen", ttl_ms=3_600_000)


class ClickCounter(Processor):
    """Per user: total clicks, clicks per page, last click time; per subtask: rows it consumed."""

    def open(self, ctx: Context) -> None:
        self.clicks = ctx.state(CLICKS)
        self.pages = ctx.state(PAGES)
        self.last_seen = ctx.state(LAST_SEEN)
        self.consumed = ctx.get_list_state("consumed")
        self.rows = 0

    def process(self, key: Any, rows: Sequence[dict], ctx: Context):
        self.clicks.update(self.clicks.value() + len(rows))
        for r in rows:
            self.pages.put(r["page"], self.pages.get(r["page"], 0) + 1)
        self.last_seen.update(max(r["ts"] for r in rows))
        self.rows += len(rows)
        yield {"user": key, "clicks": self.clicks.value()}

    def end_batch(self, ctx: Context):
        self.consumed.add([ctx.batch_id, ctx.subtask_index, self.rows])
        self.rows = 0
        return None


def generate(batches: int, per_batch: int, users: int, seed: int = 42) -> list[list[dict]]:
    rng = random.Random(seed)
    pages = [f"/page/{i}" for i in range(20)]
    t0 = 1_700_000_000_000
    return [[{"user": f"user-{int(rng.paretovariate(1.2) * 7) % users}", "page": rng.choice(pages),
              "ts": t0 + (b * per_batch + i) * 10} for i in range(per_batch)] for b in range(batches)]


def run_demo(workdir: str = "demo-out", quick: bool = False, as_json: bool = False) -> int:
    n_batches, per_batch, users = (10, 500, 500) if quick else (24, 5_000, 20_000)
    shutil.rmtree(workdir, ignore_errors=True)
    root, local = f"{workdir}/checkpoints", f"{workdir}/local-state"
    source = generate(n_batches, per_batch, users)
    last_output: dict[str, int] = {}

    def sink(rows: list[dict], batch_id: int) -> None:
        for r in rows:
            last_output[r["user"]] = r["clicks"]

    results: list[BatchResult] = []
    started = time.perf_counter()
    stop_at = n_batches // 2
    say = (lambda _text: None) if as_json else progress_line
    say(f"spate demo: {n_batches} batches of {per_batch:,} clicks, parallelism 2 on lmdb, then a restart at 3 "
        f"on the heap table with the changelog; checkpoint root {os.path.abspath(root)}")
    with LocalRunner(ClickCounter, key="user", checkpoint_root=root, parallelism=2, table="lmdb", local_dir=local,
                     sink=sink) as runner:
        results += runner.run(source, until=stop_at)
    say(f"  {len(results)} batches checkpointed; stopped, restarting at parallelism 3")
    with LocalRunner(ClickCounter, key="user", checkpoint_root=root, parallelism=3, table="heap",
                     changelog=True, file_merging="across", sink=sink) as runner:
        results += runner.run(source)
    elapsed = time.perf_counter() - started
    say(f"  {len(results)} batches checkpointed; verifying the state against an independent computation")

    summary = _summarize(source, results, root, last_output, elapsed, stop_at) | {"root": os.path.abspath(root)}
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    return 0 if summary["verified"] else 1


def verify_clicks(source: list[list[dict]], root: str, last_output: dict[str, int]) -> tuple[dict[str, bool],
                                                                                           list[str]]:
    """Check the latest checkpoint and the sink's last outputs against an independent computation."""
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage)
    want_clicks = Counter(r["user"] for rows in source for r in rows)
    want_pages = Counter((r["user"], r["page"]) for rows in source for r in rows)
    clicks = {e.key: e.value for e in keyed_state_entries(storage, meta, "clicks")}
    pages = {(e.key, e.user_key): e.value for e in keyed_state_entries(storage, meta, "pages")}
    consumed = [x for per in operator_state_elements(storage, meta, "consumed") for x in per]
    problems = verify_checkpoint(storage, meta)
    return {
        "clicks per user": clicks == dict(want_clicks),
        "clicks per user and page": pages == dict(want_pages),
        "sink saw final counts": last_output == dict(want_clicks),
        "operator state: every batch's rows once": sum(x[2] for x in consumed) == sum(map(len, source))
        and len({(x[0], x[1]) for x in consumed}) == len(consumed),
        "checksums of every file": not problems,
    }, problems


def _summarize(source: list[list[dict]], results: list[BatchResult], root: str, last_output: dict[str, int],
               elapsed: float, stop_at: int) -> dict[str, Any]:
    storage = CheckpointStorage(root)
    meta = load_checkpoint(storage)
    want_clicks = Counter(r["user"] for rows in source for r in rows)
    checks, problems = verify_clicks(source, root, last_output)
    rows = sum(map(len, source))
    first_after = results[stop_at].checkpoint.subtasks if len(results) > stop_at else []
    restore_ms = max((st.restore_ms for st in first_after), default=0.0)
    return {
        "batches": len(results), "rows": rows, "users": len(want_clicks), "rows_per_s": round(rows / elapsed),
        "batch_ms_p50": percentile([r.batch_ms for r in results], 50),
        "batch_ms_p99": percentile([r.batch_ms for r in results], 99),
        "checkpoint_ms_p50": percentile([r.checkpoint_ms for r in results], 50),
        "checkpoint_ms_p99": percentile([r.checkpoint_ms for r in results], 99),
        "retained_checkpoints": sorted(n for d in storage.list_dirs() if (n := checkpoint_id_of(d)) is not None),
        "latest_checkpoint": meta.checkpoint_id, "state_bytes": meta.state_bytes,
        "files_alive": len(storage.list_files()),
        "rescale": {"stopped_after_batch": stop_at - 1, "from_parallelism": 2, "to_parallelism": 3,
                    "from_table": "lmdb", "to_table": "heap + changelog + file merging", "restore_ms": restore_ms,
                    "subtasks_restored": results[stop_at].restored_subtasks if len(results) > stop_at else []},
        "checks": checks, "verified": all(checks.values()), "problems": problems,
    }


def _print(s: dict[str, Any]) -> None:
    r = s["rescale"]
    print("spate demo: clickstream click counts on the in-process runner\n")
    print(format_table([
        {"what": "input", "value": f"{s['rows']:,} clicks of {s['users']:,} users in {s['batches']} batches"},
        {"what": "throughput", "value": f"{s['rows_per_s']:,} rows/s (including checkpoints)"},
        {"what": "batch duration", "value": f"p50 {s['batch_ms_p50']:.1f} ms, p99 {s['batch_ms_p99']:.1f} ms"},
        {"what": "checkpoint duration", "value": f"p50 {s['checkpoint_ms_p50']:.2f} ms, p99 "
                                               f"{s['checkpoint_ms_p99']:.2f} ms"},
        {"what": "checkpoints", "value": f"one per batch; retained {s['retained_checkpoints']}"},
        {"what": "state", "value": f"{human_bytes(s['state_bytes'])} in the latest checkpoint, "
                                   f"{s['files_alive']} files under the root"},
        {"what": "rescale", "value": f"stopped after batch {r['stopped_after_batch']}, restarted at parallelism "
                                     f"{r['to_parallelism']} (was {r['from_parallelism']}), {r['from_table']} → "
                                     f"{r['to_table']} table; subtasks {r['subtasks_restored']} restored in ≤ "
                                     f"{r['restore_ms']:.1f} ms each"},
    ], title="summary"))
    print_checks(s)
    print(next_steps(s["root"]))


def next_steps(root: str) -> str:
    """Where the demo left its checkpoints, and the commands to look at them, as they run from here."""
    spate, at = spate_command(), shlex.quote(root)
    return "\n".join([f"\ncheckpoint root: {root}", "try next:",
                      f"  {spate} checkpoints list {at}",
                      f"  {spate} checkpoints verify {at}",
                      f"  {spate} state dump {at} --state clicks --limit 5"])


def spate_command() -> str:
    """The ``spate`` command as it runs from the current directory: ``spate`` when that name on ``PATH`` is this
    environment's, else this environment's script by path (``.venv/bin/spate`` after ``make``)."""
    script = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "spate")
    on_path = shutil.which("spate")
    if not os.path.exists(script) or (on_path and os.path.samefile(on_path, script)):
        return "spate"
    relative = os.path.relpath(script)
    return shlex.quote(script if relative.startswith("..") else relative)


def progress_line(text: str) -> None:
    """One line of progress on standard error (the results go to standard output)."""
    print(text, file=sys.stderr, flush=True)


def print_checks(s: dict[str, Any]) -> None:
    """The verification table of a demo summary, its problems and the verdict."""
    print()
    print(format_table([{"check": k, "result": "ok" if v else "FAILED"} for k, v in s["checks"].items()],
                       title="verification against an independent computation"))
    for p in s["problems"]:
        print(f"  {p}")
    print("\nverified: state and outputs equal the expected result" if s["verified"] else "\nVERIFICATION FAILED")
