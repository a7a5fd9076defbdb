"""A stateful stream on a 2-executor Spark cluster (local-cluster: separate executor JVMs and Python workers),
run by tests/test_spark_cluster.py in its own driver process, bounded in time there."""

from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter

from pyspark import cloudpickle
from pyspark.sql import SparkSession

from spate import load_checkpoint, verify_checkpoint
from spate.checkpoint.coordinator import list_complete_checkpoints
from spate.fs import CheckpointStorage


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import test_spark_stream as t

    cloudpickle.register_pickle_by_value(t)  # executors cannot import test modules
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    tmp = tempfile.mkdtemp()
    source, root, log = f"{tmp}/in", f"{tmp}/ckpt", {}
    batches = t.clicks(6)
    t.write_files(source, batches[:3])
    settings = {"table": "lmdb", "file_merging": "across", "changelog": True}
    first, _ = t.run_stream(spark, source, root, 3, log, **settings)
    t.write_files(source, batches[3:], start=3)
    second, _ = t.run_stream(spark, source, root, 5, log, **settings)  # a restart at another parallelism
    storage = CheckpointStorage(root)
    for n in list_complete_checkpoints(storage):
        meta = load_checkpoint(storage, n)
        assert [st.stats["spark_partition"] for st in meta.subtasks] == list(range(meta.parallelism)), n
        assert verify_checkpoint(storage, meta) == [], n
    assert t.state(root) == dict(Counter(r["user"] for b in batches for r in b)), "state"
    assert sorted(log) == list(range(6)), sorted(log)
    metrics = first.metrics + second.metrics
    assert [m.spark_jobs for m in metrics] == [1] * 6, [m.spark_jobs for m in metrics]
    print("restored per batch after the restart", [m.restored_subtasks for m in second.metrics])
    print("CLUSTER OK")
    spark.stop()


if __name__ == "__main__":
    main()
