"""The test JVMs' quick settings (``spate_tools.standalone``): the checkpoint file manager the tests' Spark sessions
name is a class of the installed pyspark (its package moved in 4.1; `make smoke` runs this on every version)."""

from __future__ import annotations

import glob
import os
import zipfile

import pyspark

from spate_tools.standalone import quick_checkpoint_conf


def test_the_checkpoint_file_manager_is_a_class_of_this_pyspark():
    (name,) = quick_checkpoint_conf().values()
    assert name.endswith(".FileSystemBasedCheckpointFileManager")
    (jar,) = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "spark-sql_*.jar"))
    with zipfile.ZipFile(jar) as classes:
        assert name.replace(".", "/") + ".class" in classes.namelist(), (pyspark.__version__, name)
