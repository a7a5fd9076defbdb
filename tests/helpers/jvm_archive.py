"""A class-data-sharing archive of a Spark driver's classes, made once per virtual environment, so that the many
Spark drivers the test suite starts load their classes from it (about 4 s less for each, measured alone on the
2-core machine: 11-14 s against 15-18 s for a small job from launch to exit). :data:`ARCHIVE` is where ``make test``
makes it, in the virtual environment.

    python tests/helpers/jvm_archive.py ARCHIVE

runs :mod:`helpers.spark_job` (three small batches) in a driver JVM told to write the classes it loaded to ARCHIVE
when it exits (``-XX:ArchiveClassesAtExit``, Java 13 on). tests/conftest.py passes it to the drivers pyspark starts
(:func:`use`); a JVM of another build or class path ignores it and loads its classes as usual.
Test infrastructure only: spate neither makes nor uses it. Exits 0 without an archive when the JVM cannot make one.

:func:`use` also starts those drivers with the quick compiler only and the serial collector
(:data:`~spate_tools.standalone.QUICK_JVM_OPTIONS`, as the cluster tests' JVMs): the suite is bound by its 2 cores,
and a test's driver runs small jobs for seconds, where the optimizing compiler costs more CPU than it saves. A small
job's driver took 12-15 s of CPU with them against 21-27 s without (measured alone, 2026-11-27).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile

from spate_tools.standalone import QUICK_JVM_OPTIONS

ARCHIVE = os.path.join(sys.prefix, "spark-driver-classes.jsa")
JVM_LOGS_OFF = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # an archive the JVM cannot use is no warning in a test's output


# the job, then the driver JVM ended and waited for: it writes the archive as it exits, after the Python driver
TRAIN = """
import runpy, sys
from pyspark import SparkContext
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")  # as its own script: its processor pickled by value
jvm = SparkContext._gateway.proc  # spark-submit, which execs the driver JVM
jvm.stdin.close()  # the driver JVM exits when its standard input closes
sys.exit(jvm.wait(timeout=120))
"""


def make(archive: str) -> bool:
    """Make ``archive`` (replaced atomically once complete); False if the JVM did not write one."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from helpers.clicks import JOB, clicks
    from helpers.file_source import write_files

    partial = f"{archive}.{os.getpid()}.partial"
    with tempfile.TemporaryDirectory(prefix="spate-jvm-archive-") as tmp:
        source, root, out = (os.path.join(tmp, name) for name in ("in", "ckpt", "out"))
        write_files(source, clicks(3))
        env = {**os.environ, "PYSPARK_SUBMIT_ARGS":
               f"--driver-java-options '-XX:ArchiveClassesAtExit={partial} {JVM_LOGS_OFF}' pyspark-shell"}
        done = subprocess.run([sys.executable, "-c", TRAIN, JOB, source, root, out, "2"], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0 or not os.path.isfile(partial) or not os.path.getsize(partial):
        print(f"no JVM class archive (exit {done.returncode}): {done.stderr[-1500:]}", file=sys.stderr)
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        return False
    os.replace(partial, archive)
    return True


def use(archive: str = ARCHIVE) -> None:
    """Start the Spark drivers pyspark launches from here on (this process's and its children's) with the quick
    JIT options, and with ``archive`` if there is one, unless ``PYSPARK_SUBMIT_ARGS`` is set already. Without an
    archive only the options apply: a JVM given an archive file that does not exist turns off its own base archive
    too."""
    if "PYSPARK_SUBMIT_ARGS" in os.environ:
        return
    shared = f"-XX:SharedArchiveFile={archive} {JVM_LOGS_OFF} " if os.path.isfile(archive) else ""
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--driver-java-options '{shared}{QUICK_JVM_OPTIONS}' pyspark-shell"


if __name__ == "__main__":
    make(sys.argv[1])
