"""Shared fixtures. ``spark`` (a real local[2] SparkSession) comes from spark_fixture.py."""

from __future__ import annotations

import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

from spark_fixture import spark  # noqa: E402,F401

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")
