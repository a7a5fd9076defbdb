"""spate: Flink-grade state for PySpark streaming.

Keyed state in key groups, rescalable operator state (FLIP-8), checkpoints with a coordinator, and an
in-process runner that drives the same driver/task protocol the Spark transport uses.
"""

from __future__ import annotations

__version__ = "0.1.0"
