"""The ``spate`` command: inspect and verify checkpoints, dump state, run benchmarks and the demo.

Every command prints a readable table by default and one JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.checkpoint.discovery import open_root
from spate.checkpoint.inspect import (
    checkpoint_summary,
    describe_error,
    keyed_state_entries,
    keyed_state_names,
    load_checkpoint,
    operator_state_elements,
    operator_state_names,
    physical_files,
    subtask_recoveries,
    verify_checkpoint,
    verify_root_files,
)
from spate.checkpoint.metadata import CheckpointMetadata
from spate.checkpoint.savepoint import take_savepoint
from spate.errors import SpateError
from spate.fs import CheckpointStorage
from spate.report import format_table, human_bytes
from spate.snapshot.handles import KeyGroupsHandle, held_key_groups


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=_json_default))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray)):
        return obj.hex()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def cmd_list(args: argparse.Namespace) -> int:
    storage = open_root(args.root)
    ids = list_complete_checkpoints(storage)
    listed = [_listed(storage, n) for n in ids]
    metas = [m for m, _ in listed if m is not None]
    rows = [checkpoint_summary(m) | {"ok": True} if m is not None else {"checkpoint_id": n, "ok": False,
                                                                        "problem": problem}
            for (m, problem), n in zip(listed, ids, strict=True)]
    rescales = metas[-1].rescales if metas else []
    if args.json:
        _print_json({"root": args.root, "checkpoints": rows, "rescales": rescales})
        return 0
    table = [_list_row(r, m) for r, (m, _) in zip(rows, listed, strict=True)]
    print(format_table(table, title=f"complete checkpoints under {args.root} (metadata: read and its checksum "
                                    "checked; `spate checkpoints verify` reads every file)"))
    for r in rows:
        if not r["ok"]:
            print(f"checkpoint {r['checkpoint_id']}: {r['problem']}")
    if rescales:
        print()
        print(format_table([{"checkpoint": r["checkpoint_id"], "from": r["from"], "to": r["to"], "why": r["reason"]}
                            for r in rescales], title="rescales (the latest, as the newest checkpoint records them)"))
    return 0


def _listed(storage: CheckpointStorage, checkpoint_id: int) -> tuple[CheckpointMetadata | None, str]:
    """Checkpoint ``checkpoint_id``'s metadata, or None and why it cannot be read (the others are still listed)."""
    try:
        return load_checkpoint(storage, checkpoint_id), ""
    except SpateError as e:
        return None, describe_error(e)


def _list_row(r: dict[str, Any], m: CheckpointMetadata | None) -> dict[str, Any]:
    if m is None:
        return {"checkpoint": r["checkpoint_id"], "metadata": "CORRUPT (below)"}
    return {"checkpoint": r["checkpoint_id"], "metadata": "ok", "parallelism": r["parallelism"],
            "max_par": r["max_parallelism"],
            "rescaled": f"{m.rescaled_from} -> {m.parallelism}" if m.rescaled_from is not None else "",
            "files": r["files"], "segments": r["segments"], "size": human_bytes(r["state_bytes"]),
            "watermark": r["watermark_ms"]}


def cmd_show(args: argparse.Namespace) -> int:
    storage = open_root(args.root)
    meta = load_checkpoint(storage, args.checkpoint)
    files = physical_files(storage, meta)
    recoveries = subtask_recoveries(meta)
    if args.json:
        _print_json({"summary": checkpoint_summary(meta), "subtasks": recoveries, "files": files,
                     "metadata": meta.to_dict()})
        return 0
    s = checkpoint_summary(meta)
    print(f"checkpoint {meta.checkpoint_id} of query {meta.query_id} (epoch {meta.epoch})")
    print(f"  parallelism {meta.parallelism}, max parallelism {meta.max_parallelism}, {s['segments']} segments in "
          f"{s['files']} files, {human_bytes(s['state_bytes'])}, watermark {meta.watermark_ms}")
    print(f"  keyed states: {keyed_state_names(meta) or '-'}")
    print(f"  operator states: {operator_state_names(meta) or '-'}\n")
    print(format_table([_recovery_row(r) for r in recoveries],
                       title="subtasks: where each ran, how its state got to the batch's base checkpoint"))
    print()
    rows: list[dict[str, object]] = []
    for i, st in enumerate(meta.subtasks):
        for h in st.keyed:
            rows.append({"subtask": i, "kind": "keyed" if isinstance(h, KeyGroupsHandle) else "keyed (lmdb native)",
                         "key_groups": f"{h.start}-{h.end}", "groups_with_data": len(held_key_groups(h)),
                         "bytes": h.state_bytes, "segment": _at(h)})
        for c in st.changelog:
            rows.append({"subtask": i, "kind": f"changelog sqn {c.sqn}", "key_groups": f"{min(c.offsets)}-"
                         f"{max(c.offsets)}", "groups_with_data": len(c.offsets), "bytes": c.state_bytes,
                         "segment": _at(c)})
        for kind, other in (("operator", st.operator), ("staged outputs", st.outputs)):
            if other is not None:
                rows.append({"subtask": i, "kind": kind, "key_groups": "-", "groups_with_data": None,
                             "bytes": other.size, "segment": _at(other)})
    print(format_table(rows, title="state handles (segment: file@offset)"))
    print()
    print(format_table([{**f, "segment_bytes": human_bytes(f["segment_bytes"]),
                         "file_bytes": "missing" if f["file_bytes"] is None else human_bytes(f["file_bytes"])}
                        for f in files], title="physical files"))
    logical, physical = sum(f["segment_bytes"] for f in files), sum(f["file_bytes"] or 0 for f in files)
    print(f"  this checkpoint's segments: {human_bytes(logical)} in {human_bytes(physical)} of files "
          f"(space amplification {physical / logical if logical else 1:.2f}; files may also hold live segments "
          "of other retained checkpoints)")
    names = list(dict.fromkeys(k for st in meta.subtasks for k in st.stats))
    stats = [{"statistic": n, **{f"subtask {i}": st.stats.get(n) for i, st in enumerate(meta.subtasks)}}
             for n in names]
    print()
    print(format_table(stats, title="subtask statistics"))
    return 0


def _recovery_row(r: dict[str, Any]) -> dict[str, Any]:
    how = {"caught_up": f"caught up {r['caught_up_from']} -> {r['restored_from']}",
           "restored": f"restored from {r['restored_from']}"}.get(r["recovery"], r["recovery"])
    return {"subtask": r["subtask"], "executor": r["executor"] or "-", "state": how,
            "read": human_bytes(r["restore_bytes"]), "restore_ms": round(r["restore_ms"], 1), "rows": r["rows"]}


def _at(handle: Any) -> str:
    ref = handle.segment
    return f"{ref.path}@{ref.offset}" if ref.offset else ref.path


def cmd_verify(args: argparse.Namespace) -> int:
    storage = open_root(args.root)  # not a root: a usage error (exit 2), as for every command
    try:  # whatever fails, verification ends with a readable line and exit 1, never a traceback
        ids = list_complete_checkpoints(storage)
        root_problems = verify_root_files(storage, ids)
        results = [_verify_one(storage, n) for n in ids]
    except Exception as e:  # noqa: BLE001
        print(f"spate: error: {describe_error(e)}", file=sys.stderr)
        return 1
    ok = bool(results) and not root_problems and all(r["ok"] for r in results)
    if args.json:
        _print_json({"root": args.root, "ok": ok, "root_problems": root_problems, "checkpoints": results})
    else:
        if not results:
            print(f"no complete checkpoint under {args.root}")
        print(format_table([{"checkpoint": r["checkpoint"], "files": r["files"], "segments": r["segments"],
                             "status": "ok" if r["ok"] else f"{len(r['problems'])} problem(s)"} for r in results],
                           title="verification (every segment's checksums)"))
        for p in root_problems:
            print(f"root files (_query, _delivered): {p}")
        for r in results:
            for p in r["problems"]:
                print(f"checkpoint {r['checkpoint']}: {p}")
    return 0 if ok else 1


def cmd_savepoint(args: argparse.Namespace) -> int:
    """Copy a retained checkpoint (the way back to an older one, or off a root whose latest is corrupt) into a
    self-contained savepoint, after checking every byte of it; print how a new query restores from it."""
    storage = open_root(args.root)
    meta, problem = _listed(storage, args.checkpoint)
    if meta is None:
        print(f"spate: error: checkpoint {args.checkpoint} of {args.root} cannot be read: {problem}; `spate "
              f"checkpoints list {args.root}` shows the ones that can", file=sys.stderr)
        return 1
    problems = verify_checkpoint(storage, meta)
    if problems:
        print(f"spate: error: checkpoint {args.checkpoint} does not verify, so no savepoint of it was written: "
              f"{'; '.join(problems)}; take one of an older checkpoint", file=sys.stderr)
        return 1
    try:
        target = take_savepoint(storage, meta, args.to)
    except (SpateError, ValueError) as e:
        print(f"spate: error: {describe_error(e)}", file=sys.stderr)
        return 1
    if args.json:
        _print_json({"root": args.root, "checkpoint": args.checkpoint, "savepoint": target})
        return 0
    print(f"savepoint of checkpoint {args.checkpoint} of {args.root}: {target}\n"
          f"restart from it in a new root: LocalRunner(..., checkpoint_root=NEW_ROOT, restore_from={target!r}) "
          f"or StatefulStream(..., checkpoint_root=NEW_ROOT, restore_from={target!r})")
    return 0


def _verify_one(storage: CheckpointStorage, checkpoint_id: int) -> dict[str, Any]:
    try:
        meta = load_checkpoint(storage, checkpoint_id)
        problems = verify_checkpoint(storage, meta)
        files, segments = len(meta.files()), len(meta.segments())
    except Exception as e:  # noqa: BLE001 - a problem of this checkpoint, reported with the others
        problems, files, segments = [describe_error(e)], 0, 0
    return {"checkpoint": checkpoint_id, "files": files, "segments": segments, "ok": not problems,
            "problems": problems}


def cmd_dump(args: argparse.Namespace) -> int:
    storage = open_root(args.root)
    meta = load_checkpoint(storage, args.checkpoint)
    if args.state in operator_state_names(meta):
        per_subtask = operator_state_elements(storage, meta, args.state, args.allow_pickle)
        rows: list[dict[str, Any]] = [{"subtask": i, "element": e} for i, els in enumerate(per_subtask) for e in els]
    else:
        rows = [{"key": e.key, "namespace": e.namespace, "user_key": e.user_key, "value": e.value,
                 "key_group": e.key_group, "subtask": e.subtask}
                for e in keyed_state_entries(storage, meta, args.state, args.allow_pickle)]
        rows.sort(key=lambda r: (r["key_group"], repr(r["key"]), repr(r["namespace"]), repr(r["user_key"])))
    total = len(rows)
    if args.limit is not None:
        rows = rows[:args.limit]
    if args.json:
        _print_json({"checkpoint": meta.checkpoint_id, "state": args.state, "entries": total, "rows": rows})
        return 0
    if rows and all(r.get("namespace") is None for r in rows):
        rows = [{k: v for k, v in r.items() if k != "namespace"} for r in rows]
    if rows and all(r.get("user_key") is None for r in rows):
        rows = [{k: v for k, v in r.items() if k != "user_key"} for r in rows]
    print(format_table(rows, title=f"state {args.state!r} in checkpoint {meta.checkpoint_id} "
                                   f"({total} entries{', showing ' + str(len(rows)) if len(rows) < total else ''})"))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from spate_tools.bench import BenchFn, run_bench

    if (args.profile or args.variants) and args.name != "spark":
        print("--profile and --variants are for `spate bench spark`", file=sys.stderr)
        return 2
    if (args.large or args.state_gb is not None) and (args.name != "cluster" or args.quick or not args.large):
        print("--large (and --state-gb, which needs it) is for `spate bench cluster`, without --quick",
              file=sys.stderr)
        return 2
    bench: BenchFn | None = None
    if args.name == "spark":  # only the CLI reaches into spate.spark
        from functools import partial

        from spate_tools.bench.spark import bench_spark

        bench = partial(bench_spark, profile=args.profile, out_dir=args.out,
                        variants=args.variants.split(",") if args.variants else None)
    elif args.name == "cluster" and args.large:  # the large-state case only, at --state-gb (default 4)
        from functools import partial

        from spate_tools.bench.cluster_large import bench_cluster_large

        state_gb = 4.0 if args.state_gb is None else args.state_gb
        bench = partial(bench_cluster_large, state_gb=state_gb, out_dir=args.out)
    elif args.name == "cluster":
        from spate_tools.bench.cluster import bench_cluster

        bench = bench_cluster
    elif args.name == "blog":  # writes its own charts (duration and size over time) next to the summary plot
        from functools import partial

        from spate_tools.bench.blog import bench_blog

        bench = partial(bench_blog, out_dir=args.out)
    elif args.name == "rescale":  # writes its own chart (normal / online / restart) next to the summary plot
        from functools import partial

        from spate_tools.bench.rescale import bench_rescale

        bench = partial(bench_rescale, out_dir=args.out)
    elif args.name == "connect":  # starts Spark Connect servers on 127.0.0.1
        from spate_tools.bench.connect import bench_connect

        bench = bench_connect
    elif args.name == "first":  # only the CLI reaches into spate.spark
        from spate_tools.bench.first_output import bench_first

        bench = bench_first
    elif args.name == "scale":  # writes its own chart (batch and checkpoint times over the run) beside the plot
        from functools import partial

        from spate_tools.bench.scale import bench_scale, rows_log

        bench = partial(bench_scale, out_dir=args.out, on_row=rows_log(os.path.join(args.out, "scale-rows.jsonl")))
    return run_bench(args.name, quick=args.quick, as_json=args.json, out_dir=args.out, bench=bench)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.local:
        from spate_tools.demo import run_demo

        return run_demo(workdir=args.dir, quick=args.quick, as_json=args.json)
    from spate_tools.spark_demo import run_spark_demo

    return run_spark_demo(workdir=args.dir, quick=args.quick, as_json=args.json)


def cmd_fuzz(args: argparse.Namespace) -> int:
    from spate_tools.campaigns.fuzz import run_from_args

    return run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spate", description="Flink-grade state for PySpark streaming.")
    sub = p.add_subparsers(dest="command", required=True)

    cp = sub.add_parser("checkpoints", help="list, show and verify checkpoints")
    cps = cp.add_subparsers(dest="action", required=True)
    for name, fn, help_ in (("list", cmd_list, "complete checkpoints with sizes"),
                            ("show", cmd_show, "one checkpoint: handles, files, statistics"),
                            ("verify", cmd_verify, "read every referenced byte and check checksums; exit 1 on "
                                                   "any problem")):
        sp = cps.add_parser(name, help=help_)
        sp.add_argument("root", help="checkpoint root (path or URI)")
        if name == "show":
            sp.add_argument("--checkpoint", type=int, default=None, help="checkpoint id (default: latest)")
        sp.add_argument("--json", action="store_true", help="print one JSON object")
        sp.set_defaults(func=fn)
    save = cps.add_parser("savepoint", help="copy a retained checkpoint (e.g. an older one) into a self-contained "
                                            "savepoint a new query restores from (restore_from=)")
    save.add_argument("root", help="checkpoint root (path or URI)")
    save.add_argument("--checkpoint", type=int, required=True, help="the retained checkpoint's id")
    save.add_argument("--to", required=True, help="the savepoint's directory (path or URI), outside the root")
    save.add_argument("--json", action="store_true", help="print one JSON object")
    save.set_defaults(func=cmd_savepoint)

    st = sub.add_parser("state", help="read state from a checkpoint")
    sts = st.add_subparsers(dest="action", required=True)
    dump = sts.add_parser("dump", help="print the entries of one keyed or operator state")
    dump.add_argument("root", help="checkpoint root or savepoint directory")
    dump.add_argument("--state", required=True, help="state name (timers: timers:event, timers:processing)")
    dump.add_argument("--checkpoint", type=int, default=None, help="checkpoint id (default: latest)")
    dump.add_argument("--limit", type=int, default=None, help="print at most this many entries")
    dump.add_argument("--allow-pickle", action="store_true", help="decode pickled values (runs code from the "
                                                                  "checkpoint: only for trusted data)")
    dump.add_argument("--json", action="store_true", help="print one JSON object")
    dump.set_defaults(func=cmd_dump)

    bench = sub.add_parser("bench", help="benchmarks (print a table, write PNG plots, --json)")
    bench.add_argument("name", choices=["state", "changelog", "filemerging", "bigstate", "spark", "first", "cluster",
                                        "blog", "rescale", "scale", "connect"],
                       help="which benchmark (cluster: starts a standalone Spark cluster on 127.0.0.1; scale: 1 GB "
                            "and 10 GB of lmdb state, needs about 70 GB of free disk; connect: classic against Spark "
                            "Connect sessions of a 2-executor cluster on 127.0.0.1)")
    bench.add_argument("--quick", action="store_true", help="reduced size, under a minute")
    bench.add_argument("--json", action="store_true", help='print {"bench": NAME, "results": [...]}')
    bench.add_argument("--out", default="bench-out", help="directory for PNG plots (default bench-out)")
    bench.add_argument("--profile", action="store_true",
                       help="spark only: a per-batch time breakdown (Spark's jobs and stages, read from its UI "
                            "on 127.0.0.1; spate's worker phases)")
    bench.add_argument("--variants", default=None,
                       help="spark only: run only these variants (comma-separated, e.g. floor,spate); a ratio "
                            "whose base did not run is left empty")
    bench.add_argument("--large", action="store_true",
                       help="cluster only: run the large-state case instead (4 GB of lmdb state over 2 workers, an "
                            "executor killed, its subtask's restore against the OS copying the same bytes; needs 7x "
                            "the state free on --out's disk)")
    bench.add_argument("--state-gb", type=float, default=None,
                       help="with --large: the state's size in GB (default 4)")
    bench.set_defaults(func=cmd_bench)

    demo = sub.add_parser("demo", help="run the demo job on Spark: checkpoints, a stop, a rescale 2 → 4, "
                                       "verification, a chart")
    demo.add_argument("--dir", default="demo-out", help="working directory (default demo-out)")
    demo.add_argument("--quick", action="store_true", help="smaller input")
    demo.add_argument("--local", action="store_true", help="the in-process runner instead of Spark (no JVM)")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.set_defaults(func=cmd_demo)

    from spate_tools.campaigns.fuzz import add_arguments as add_fuzz_arguments

    fuzz = sub.add_parser("fuzz", help="crash-fuzz campaign: SIGKILL a job at every protocol step, restart it with "
                                       "random switches, compare with a crash-free run and a model; exit 1 on "
                                       "any divergence")
    add_fuzz_arguments(fuzz)
    fuzz.set_defaults(func=cmd_fuzz)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    except (SpateError, ValueError) as e:
        print(f"spate: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
