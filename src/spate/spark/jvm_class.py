"""A JVM class through py4j by its full name: one class lookup in the driver's JVM.

py4j resolves ``jvm.java.util.Arrays`` a name at a time and asks the JVM whether each prefix is a class: ``java``
and ``java.util`` are lookups that fail, and a first name is tried again under each package pyspark imports into
its gateway (about ten lookups for ``java``). A lookup that fails reads the index of every jar on Spark's class
path (about 250), so a dotted path cost the driver's JVM a dozen full class-path scans per use. The full name is
one lookup that finds the class. :func:`jvm_class` is how spate's driver code names JVM classes it calls every
batch.
"""

from __future__ import annotations

from typing import Any


def jvm_class(jvm: Any, name: str) -> Any:
    """The class ``name`` (fully qualified, e.g. ``"java.util.Arrays"``) of the py4j view ``jvm`` (a
    ``SparkContext._jvm``)."""
    return getattr(jvm, name)


__all__ = ["jvm_class"]
