"""A class-data-sharing archive of a Spark driver's classes, made once per virtual environment, so that the many
Spark drivers the test suite starts load their classes from it (about 4 s less for each, measured alone on the
2-core machine: 11-14 s against 15-18 s for a small job from launch to exit). :data:`ARCHIVE` is where ``make test``
makes it, in the virtual environment.

    python tests/helpers/jvm_archive.py ARCHIVE

runs :mod:`helpers.spark_job` (three small batches) in a driver JVM told to write the classes it loaded to ARCHIVE
when it exits (``-XX:ArchiveClassesAtExit``, Java 13 on). tests/conftest.py passes it to the drivers pyspark starts
(:func:`use`); a JVM of another build or class path ignores it and loads its classes as usual.
Test infrastructure only: spate neither makes nor uses it. Exits 0 without an archive when the JVM cannot make one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile

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
    """Start the Spark drivers pyspark launches from here on (this process's and its children's) with ``archive``,
    if there is one and ``PYSPARK_SUBMIT_ARGS`` is not set already. Without one nothing changes: a JVM given an
    archive file that does not exist turns off its own base archive too."""
    if os.path.isfile(archive) and "PYSPARK_SUBMIT_ARGS" not in os.environ:
        os.environ["PYSPARK_SUBMIT_ARGS"] = \
            f"--driver-java-options '-XX:SharedArchiveFile={archive} {JVM_LOGS_OFF}' pyspark-shell"


if __name__ == "__main__":
    make(sys.argv[1])
