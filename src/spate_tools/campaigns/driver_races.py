"""``spate fuzz --drivers``: two drivers on one checkpoint root, racing for real.

Each race prepares a root with a few complete checkpoints, then starts driver *processes* on it: two at the
same instant (``simultaneous``), the second a random moment after the first while it processes batches
(``staggered``), three at random moments (``three``), or two where the first is frozen (SIGSTOP) while the
second takes over and thawed (SIGCONT) while the second runs (``paused``: a stale driver waking up with work in
flight). Each driver runs a keyed count with random switches (parallelism, table, changelog, file merging)
until it ends or is fenced, and records the epoch it claimed, the checkpoint it resumed from and the
checkpoints it committed (``run_batch`` returned). Then one more driver restarts on the root and finishes the
job. Counted:

- ``shared_epochs``: two drivers started under the same epoch (the take-over was not exclusive);
- ``double_commits``: a batch two drivers committed;
- ``lost_checkpoints``: a committed or resumed-from checkpoint newer than the one the restart resumed from;
- ``failed_restarts``: a restart or driver that failed with anything but being fenced;
- ``divergences``: a final state that differs from the plain model of the job.

The goal is 0 of each. Engine-agnostic: LocalRunner only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from spate.checkpoint.inspect import keyed_state_entries, load_checkpoint
from spate.errors import FencedError
from spate.fs import CheckpointStorage
from spate.report import format_table
from spate.runtime.local import LocalRunner
from spate.runtime.processor import Processor
from spate.state.descriptors import ValueStateDescriptor

BATCHES = 24
KINDS = ("simultaneous", "staggered", "three", "paused")


class KeyCount(Processor):
    """Counts rows per key."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.state(ValueStateDescriptor("count", default=0))

    def process(self, key: Any, rows: Sequence[dict[str, Any]], ctx: Any) -> Any:
        self.count.update(self.count.value() + len(rows))
        return ()


def batch(n: int) -> list[dict[str, str]]:
    return [{"k": f"k{(n * 7 + i) % 13}"} for i in range(20)]


def model(batches: int) -> dict[str, int]:
    return dict(Counter(r["k"] for n in range(batches) for r in batch(n)))


@dataclass
class DriverReport:
    """What one racing driver did."""

    epoch: int | None = None
    resumed_from: int | None = None
    committed: list[int] = field(default_factory=list)
    fenced: str = ""
    failed: str = ""


@dataclass
class RaceResult:
    kind: str
    seed: int
    drivers: list[DriverReport]
    resumed_from: int | None
    restart_failed: str = ""
    diverged: bool = False

    @property
    def shared_epoch(self) -> bool:
        epochs = [d.epoch for d in self.drivers if d.epoch is not None]
        return len(set(epochs)) < len(epochs)

    @property
    def double_commits(self) -> int:
        seen = Counter(n for d in self.drivers for n in set(d.committed))
        return sum(1 for times in seen.values() if times > 1)

    @property
    def lost(self) -> bool:
        newest = max((n for d in self.drivers for n in [*d.committed, d.resumed_from] if n is not None), default=-1)
        return newest > (self.resumed_from if self.resumed_from is not None else -1)

    @property
    def failed(self) -> bool:
        return bool(self.restart_failed or any(d.failed for d in self.drivers))


def _runner(root: str, rng: random.Random, local_dir: str) -> LocalRunner:
    merging: list[bool | str] = [False, "within", "across"]
    return LocalRunner(KeyCount, key="k", checkpoint_root=root, parallelism=rng.randint(1, 4),
                       table=rng.choice(["heap", "lmdb"]), local_dir=local_dir, retained=rng.randint(1, 3),
                       changelog=rng.random() < 0.5, file_merging=rng.choice(merging))


def run_driver(root: str, start_at: float, seed: int, pause_s: float, local_dir: str) -> DriverReport:
    """One racing driver (runs in a child process): wait until ``start_at``, start, run until fenced."""
    report, rng = DriverReport(), random.Random(seed)
    time.sleep(max(0.0, start_at - time.time() - 0.02))
    while time.time() < start_at:  # the last 20 ms spinning: the drivers' starts must meet within microseconds
        continue
    try:
        with _runner(root, rng, local_dir) as r:
            report.epoch = r.coordinator.query.epoch if r.coordinator.query else None
            report.resumed_from = r.next_batch_id - 1
            for n in range(r.next_batch_id, BATCHES):
                r.run_batch(n, batch(n))
                report.committed.append(n)
                time.sleep(pause_s)
    except FencedError as e:
        report.fenced = str(e)
    except Exception as e:  # noqa: BLE001 - every other failure is a finding
        report.failed = f"{type(e).__name__}: {e}"
    return report


def _spawn(root: str, start_at: float, seed: int, pause_s: float, out: str, local_dir: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "spate_tools.campaigns.driver_races", "driver", root, str(start_at), str(seed),
            str(pause_s), out, local_dir]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _collect(proc: subprocess.Popen, out: str, timeout_s: float) -> DriverReport:
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return DriverReport(failed=f"driver did not finish within {timeout_s:.0f} s")
    if not os.path.exists(out):
        return DriverReport(failed=f"driver exited {proc.returncode}: {err.strip()[-500:]}")
    with open(out) as f:
        return DriverReport(**json.load(f))


def _start_delays(kind: str, rng: random.Random) -> tuple[float, ...]:
    """When each driver starts, in seconds after the first; later ones start while earlier ones run."""
    if kind == "simultaneous":
        return 0.0, 0.0
    if kind == "three":
        return 0.0, rng.uniform(0.05, 0.4), rng.uniform(0.05, 0.6)
    return 0.0, rng.uniform(0.2, 0.5)


def _freeze_while_taken_over(first: subprocess.Popen, start: float, second_delay: float,
                             rng: random.Random) -> None:
    """Fault injection: SIGSTOP the first driver just before the second starts, SIGCONT it while the second
    runs, so the first wakes up stale with whatever it had in flight."""
    time.sleep(max(0.0, start + second_delay - 0.05 - time.time()))
    first.send_signal(signal.SIGSTOP)
    time.sleep(0.05 + rng.uniform(0.1, 0.6))
    first.send_signal(signal.SIGCONT)


def race(kind: str, seed: int, workdir: str, timeout_s: float = 120.0) -> RaceResult:
    """One race of ``kind`` on a fresh root under ``workdir``."""
    rng = random.Random(seed)
    root, local = os.path.join(workdir, f"root-{seed}"), os.path.join(workdir, f"local-{seed}")
    with _runner(root, rng, local) as r:
        r.run([batch(n) for n in range(BATCHES)], until=rng.randint(1, 4))
    start = time.time() + 1.5  # every interpreter is up by then
    delays = _start_delays(kind, rng)
    outs = [os.path.join(workdir, f"driver-{seed}-{i}.json") for i in range(len(delays))]
    procs = [_spawn(root, start + delay, rng.randrange(2**32), 0.03, out, f"{local}-{i}")  # separate machines
             for i, (delay, out) in enumerate(zip(delays, outs, strict=True))]
    if kind == "paused":
        _freeze_while_taken_over(procs[0], start, delays[1], rng)
    drivers = [_collect(p, o, timeout_s) for p, o in zip(procs, outs, strict=True)]
    result = RaceResult(kind, seed, drivers, None)
    try:
        with _runner(root, rng, local) as r:
            result.resumed_from = r.next_batch_id - 1
            r.run([batch(n) for n in range(BATCHES)])
        storage = CheckpointStorage(root)
        got = {e.key: e.value for e in keyed_state_entries(storage, load_checkpoint(storage), "count")}
        result.diverged = got != model(BATCHES)
    except Exception as e:  # noqa: BLE001 - a restart that fails is what this counts
        result.restart_failed = f"{type(e).__name__}: {e}"
    return result


@dataclass
class Campaign:
    races: int = 0
    shared_epochs: int = 0
    double_commits: int = 0
    lost_checkpoints: int = 0
    failed_restarts: int = 0
    divergences: int = 0
    fenced_drivers: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, r: RaceResult) -> None:
        self.races += 1
        self.by_kind[r.kind] = self.by_kind.get(r.kind, 0) + 1
        self.shared_epochs += r.shared_epoch
        self.double_commits += r.double_commits
        self.lost_checkpoints += r.lost
        self.failed_restarts += r.failed
        self.divergences += r.diverged
        self.fenced_drivers += sum(bool(d.fenced) for d in r.drivers)
        if r.shared_epoch or r.double_commits or r.lost or r.failed or r.diverged:
            self.findings.append({"kind": r.kind, "seed": r.seed, "resumed_from": r.resumed_from,
                                  "restart_failed": r.restart_failed,
                                  "drivers": [asdict(d) for d in r.drivers]})

    @property
    def clean(self) -> bool:
        return not (self.shared_epochs or self.double_commits or self.lost_checkpoints or self.failed_restarts
                    or self.divergences)


def campaign(races: int, seed: int, progress: bool = True) -> Campaign:
    """``races`` races of each kind, seeded."""
    out, started = Campaign(), time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="spate-races-")
    try:
        for i in range(races):
            for kind in KINDS:
                out.add(race(kind, seed * 1000 + i * len(KINDS) + KINDS.index(kind), workdir))
                if progress:
                    print(f"\rraces {out.races}/{races * len(KINDS)}  findings {len(out.findings)}", end="",
                          file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if progress:
            print(file=sys.stderr)
    out.seconds = round(time.perf_counter() - started, 1)
    return out


FIGURES = ("races", "shared_epochs", "double_commits", "lost_checkpoints", "failed_restarts", "divergences",
           "fenced_drivers", "seconds")


def report(result: Campaign, as_json: bool) -> None:
    """Print a campaign's figures as a table (or one JSON object) and its findings."""
    data = {"campaign": "drivers", **asdict(result)}
    if as_json:
        print(json.dumps(data, indent=2))
        return
    print(format_table([{"figure": k, "value": data[k]} for k in FIGURES] +
                       [{"figure": f"races {kind}", "value": n} for kind, n in result.by_kind.items()],
                       title="driver races (goal: 0 shared epochs, double commits, lost checkpoints, "
                             "failed restarts, divergences)"))
    for f in result.findings[:10]:
        print(f"{f['kind']} race, seed {f['seed']}: resumed from {f['resumed_from']}; "
              f"{f['restart_failed'] or 'drivers: ' + json.dumps(f['drivers'])}")


def run_from_args(races: int, seed: int, as_json: bool) -> int:
    """``spate fuzz --drivers N``: exit 1 on any finding."""
    result = campaign(races, seed)
    report(result, as_json)
    return 0 if result.clean else 1


def _driver_main(argv: list[str]) -> None:
    root, start_at, seed, pause_s, out, local_dir = argv
    report = run_driver(root, float(start_at), int(seed), float(pause_s), local_dir)
    with open(out, "w") as f:
        json.dump(asdict(report), f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m spate_tools.campaigns.driver_races")
    parser.add_argument("command", choices=["driver"])
    parser.add_argument("args", nargs=6)
    ns = parser.parse_args()
    _driver_main(ns.args)
