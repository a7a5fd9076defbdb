"""``spate bench spark --profile``: where a micro-batch's time goes.

Driver side, from Spark's own REST API (the UI of the bench's session, bound to 127.0.0.1 and nothing else):
per batch, the Spark jobs the query ran (their job group is the query's run id, their description names the
batch) and each job's stages: wall time, task run / deserialization / GC / result serialization time, input
and shuffle bytes. Worker side, spate's per-phase timings of each batch (``SpateSettings(profile=True)``,
``BatchMetrics.profile``: Arrow read, grouping, processor calls, state, snapshot, outputs) when this spate's
runtime reports them.

:func:`breakdown` turns both into one figure per phase (p50 over a run's steady batches);
:func:`phase_table` and :func:`jobs_table` print them side by side for several runs.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from spate.report import format_table, percentile

LOOPBACK = "127.0.0.1"
REST_TIMEOUT_S = 10.0
SETTLE_TIMEOUT_S = 10.0  # the UI learns of finished jobs through Spark's listener bus, a little later
_BATCH_RE = re.compile(r"^batch = (\d+)\b", re.MULTILINE)
_CALLSITE_PATH_RE = re.compile(r"(?<= at )\S*/")
_TCP_LISTEN = "0A"


def bind_spark_to_loopback() -> None:
    """Make the Spark JVM this process launches listen and connect on 127.0.0.1 only: its driver, block
    manager and UI follow ``SPARK_LOCAL_IP`` (without it, the UI binds to every interface and the driver to the
    host's address). The JVM reads its environment once: call this before the first session starts."""
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK


def loopback_ui_conf() -> dict[str, str]:
    """Spark conf for a session whose UI (and REST API) is on, on 127.0.0.1, at a port the OS picks (the
    JVM started after :func:`bind_spark_to_loopback`; :class:`SparkRestApi` checks where the UI listens)."""
    return {"spark.ui.enabled": "true", "spark.ui.port": "0", "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK}


def _tcp_address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of ``/proc/net/tcp{,6}`` (host byte order per 32-bit word) as an IP address."""
    words = bytes.fromhex(hex_address)
    packed = b"".join(words[i:i + 4][::-1] for i in range(0, len(words), 4))
    return ipaddress.ip_address(packed)


def listening_addresses(port: int) -> set[str]:
    """The local addresses that sockets of this machine listen on at TCP ``port`` (from ``/proc/net``)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            _slot, local, _remote, state, *_ = line.split()
            address, _, hex_port = local.partition(":")
            if state == _TCP_LISTEN and int(hex_port, 16) == port:
                ip = _tcp_address(address)
                mapped = getattr(ip, "ipv4_mapped", None)
                found.add(str(mapped or ip))
    return found


@dataclass(frozen=True)
class StageTimes:
    """One completed stage attempt, as Spark's REST API reports it (times in ms, summed over tasks)."""

    name: str
    tasks: int
    wall_ms: float
    run_ms: float
    deserialize_ms: float
    gc_ms: float
    result_serialize_ms: float
    input_bytes: int
    shuffle_read_bytes: int
    shuffle_write_bytes: int

    @staticmethod
    def from_rest(stage: dict[str, Any]) -> StageTimes:
        return StageTimes(_short_callsite(stage.get("name", "")), stage.get("numTasks", 0), _wall_ms(stage),
                          stage.get("executorRunTime", 0), stage.get("executorDeserializeTime", 0),
                          stage.get("jvmGcTime", 0), stage.get("resultSerializationTime", 0),
                          stage.get("inputBytes", 0), stage.get("shuffleReadBytes", 0),
                          stage.get("shuffleWriteBytes", 0))


@dataclass(frozen=True)
class JobTimes:
    """One Spark job of a batch and its completed stages (skipped stages left out)."""

    job_id: int
    name: str
    wall_ms: float
    stages: tuple[StageTimes, ...]


def _rest_time(text: str) -> datetime:
    """Spark's REST timestamps: ``2024-05-01T10:00:00.123GMT``."""
    return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


def _wall_ms(item: dict[str, Any]) -> float:
    """completionTime − submissionTime of a job or stage (0 if either is missing)."""
    if not item.get("submissionTime") or not item.get("completionTime"):
        return 0.0
    return (_rest_time(item["completionTime"]) - _rest_time(item["submissionTime"])).total_seconds() * 1000


def _short_callsite(name: str) -> str:
    """``collect at /a/b/stream.py:225`` → ``collect at stream.py:225``."""
    return _CALLSITE_PATH_RE.sub("", name)


def _check_loopback(url: str) -> None:
    """The UI at ``url`` is addressed as 127.0.0.1 and listens there only (not on every interface)."""
    parts = urlsplit(url)
    bound = listening_addresses(parts.port or 0)
    if parts.hostname != LOOPBACK or bound != {LOOPBACK}:
        raise RuntimeError(f"Spark's UI is at {url}, listening on {sorted(bound) or 'nothing found'}: the profile "
                           f"reads only a UI on {LOOPBACK} alone (call bind_spark_to_loopback() before the JVM "
                           "starts, and start the session with loopback_ui_conf())")


class SparkRestApi:
    """The jobs and stages of this application, from the session's own UI (on 127.0.0.1)."""

    def __init__(self, sc: Any) -> None:
        url = sc.uiWebUrl
        if not url:
            raise RuntimeError("Spark's UI is off: --profile needs a session started with loopback_ui_conf()")
        _check_loopback(url)
        self.base = f"{url.rstrip('/')}/api/v1/applications/{sc.applicationId}"

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=REST_TIMEOUT_S) as response:  # noqa: S310 (loopback)
            return json.load(response)

    def _settled_jobs(self, run_id: str) -> list[dict[str, Any]]:
        """The jobs of the query run ``run_id``, once the UI saw all of them end (or the wait timed out)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            jobs = [j for j in self._get("/jobs") if j.get("jobGroup") == run_id]
            if all(j.get("status") != "RUNNING" for j in jobs) or time.monotonic() > deadline:
                return jobs
            time.sleep(0.2)

    def jobs_by_batch(self, run_id: str) -> dict[int, list[JobTimes]]:
        """Batch id → its Spark jobs in order, for the streaming query run ``run_id`` (``query.runId``)."""
        jobs = self._settled_jobs(run_id)
        stages = {s["stageId"]: StageTimes.from_rest(s) for s in self._get("/stages?status=complete")}
        by_batch: dict[int, list[JobTimes]] = {}
        for job in sorted(jobs, key=lambda j: j["jobId"]):
            batch = _BATCH_RE.search(job.get("description") or "")
            if batch is None:
                continue
            done = tuple(stages[s] for s in sorted(job.get("stageIds", [])) if s in stages)
            by_batch.setdefault(int(batch.group(1)), []).append(
                JobTimes(job["jobId"], _short_callsite(job.get("name", "")), _wall_ms(job), done))
        return by_batch


def _spark_phases(jobs: Sequence[JobTimes]) -> dict[str, float]:
    """One batch's Spark-side figures, summed over its jobs and their stages."""
    stages = [s for j in jobs for s in j.stages]
    return {"spark jobs (count)": len(jobs), "spark jobs wall": sum(j.wall_ms for j in jobs),
            "spark stages (count)": len(stages), "stage wall (sum)": sum(s.wall_ms for s in stages),
            "task run": sum(s.run_ms for s in stages), "task deserialize": sum(s.deserialize_ms for s in stages),
            "task GC": sum(s.gc_ms for s in stages),
            "task result serialize": sum(s.result_serialize_ms for s in stages),
            "input KiB": sum(s.input_bytes for s in stages) / 1024,
            "shuffle read KiB": sum(s.shuffle_read_bytes for s in stages) / 1024,
            "shuffle write KiB": sum(s.shuffle_write_bytes for s in stages) / 1024}


def _batch_phases(progress: dict[str, Any], jobs: Sequence[JobTimes],
                  worker: dict[str, float] | None) -> dict[str, float]:
    """Every figure of one batch: the query's own durations, Spark's jobs, spate's worker phases."""
    durations = progress.get("durationMs", {})
    total = durations.get("triggerExecution", 0)
    phases: dict[str, float] = {"batch (triggerExecution)": total}
    phases |= {f"query: {k}": v for k, v in durations.items() if k != "triggerExecution"}
    spark = _spark_phases(jobs)
    phases |= spark | {"driver outside spark jobs": total - spark["spark jobs wall"]}
    phases |= {f"worker: {k}": v for k, v in (worker or {}).items()}
    return phases


def breakdown(progress: Iterable[dict[str, Any]], jobs_by_batch: dict[int, list[JobTimes]],
              worker_by_batch: dict[int, dict[str, float]]) -> dict[str, float]:
    """Phase → its p50 per batch over the batches of ``progress`` (the query's progress entries of the
    batches to count); ``worker_by_batch``: batch id → spate's worker phases (may be empty)."""
    per_batch = [_batch_phases(p, jobs_by_batch.get(p["batchId"], []), worker_by_batch.get(p["batchId"]))
                 for p in progress]
    names = dict.fromkeys(k for b in per_batch for k in b)
    return {k: _p50([b[k] for b in per_batch if k in b]) for k in names}


def job_rows(jobs_by_batch: dict[int, list[JobTimes]], batches: Iterable[int]) -> list[dict[str, Any]]:
    """One row per (job, stage) position of a batch: the job's and the stage's p50 times over ``batches``."""
    positions: dict[tuple[int, str, int], list[tuple[JobTimes, StageTimes | None]]] = {}
    for b in batches:
        for i, job in enumerate(jobs_by_batch.get(b, [])):
            for j, stage in enumerate(job.stages or (None,)):
                positions.setdefault((i, job.name, j), []).append((job, stage))
    rows = []
    for (i, name, j), seen in positions.items():
        stages = [s for _, s in seen if s is not None]
        rows.append({"job": f"{i + 1}: {name}" if j == 0 else "",
                     "job wall ms": _p50([jb.wall_ms for jb, _ in seen]) if j == 0 else None,
                     "stage": stages[0].name if stages else "(none run)",
                     "tasks": stages[0].tasks if stages else None,
                     "stage wall ms": _p50([s.wall_ms for s in stages]),
                     "task run ms": _p50([s.run_ms for s in stages]),
                     "deserialize ms": _p50([s.deserialize_ms for s in stages]),
                     "GC ms": _p50([s.gc_ms for s in stages]),
                     "shuffle r/w KiB": f"{_p50([s.shuffle_read_bytes / 1024 for s in stages]):g}/"
                                        f"{_p50([s.shuffle_write_bytes / 1024 for s in stages]):g}",
                     "batches": len(seen)})
    return rows


def _p50(values: Sequence[float]) -> float:
    return round(percentile(values, 50) or 0.0, 1)


def phase_table(title: str, phases_by_run: dict[str, dict[str, float]]) -> str:
    """One row per phase, one column per run (ms per batch, p50, unless the phase names another unit)."""
    names = dict.fromkeys(k for phases in phases_by_run.values() for k in phases)
    rows = [{"phase (p50 per batch, ms)": k, **{run: phases.get(k) for run, phases in phases_by_run.items()}}
            for k in names]
    return format_table(rows, title=title)


def jobs_table(title: str, rows_by_run: dict[str, list[dict[str, Any]]]) -> str:
    """The jobs and stages of a batch for each run, one after the other."""
    rows = [{"run": run if n == 0 else "", **row} for run, rows in rows_by_run.items() for n, row in enumerate(rows)]
    return format_table(rows, title=title)
