"""The Connect server's command line (``spate_tools.connect_server``): the Java options a caller adds reach the
server's and its executors' JVMs beside the UTC time zone every session runs in, and a setting of the caller's
replaces the default."""

from __future__ import annotations

from spate_tools.connect_server import CONF, server_command, session_conf
from spate_tools.standalone import QUICK_JVM_OPTIONS


def _settings(command: list[str]) -> dict[str, str]:
    pairs = [command[i + 1] for i, arg in enumerate(command) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_java_options_are_added_to_the_driver_and_the_executors():
    settings = _settings(server_command(15002, "local[2]", session_conf(QUICK_JVM_OPTIONS)))
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert settings[key] == f"-Duser.timezone=UTC {QUICK_JVM_OPTIONS}"
    assert settings["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert settings["spark.connect.grpc.binding.port"] == "15002"


def test_without_java_options_the_defaults_stand():
    assert session_conf() == CONF
    settings = _settings(server_command(15002, "local[2]", session_conf("", {"spark.sql.shuffle.partitions": "4"})))
    assert settings["spark.sql.shuffle.partitions"] == "4"
    assert settings["spark.driver.extraJavaOptions"] == "-Duser.timezone=UTC"
