"""The dynamic log levels (``log.level``, ``log.level.<logger>``): how the configs are checked
and how a process's loggers follow them and go back to their start levels."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from strom.log.errors import ConfigError
from strom.service.log_levels import DynamicLogLevels
from strom.service.node_configs import validate_node_configs

ROOT = logging.getLogger()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[_Lines]:
    """The ``strom.service`` logger's lines (its own handler: the root's level is what the
    tests change), and the root and test loggers as they were afterwards."""
    handler = _Lines()
    service = logging.getLogger("strom.service")
    service.addHandler(handler)
    saved = {name: logging.getLogger(name).level for name in ("", "strom.service", "t.a", "t.b")}
    ROOT.setLevel(logging.INFO)
    yield handler
    service.removeHandler(handler)
    for name, level in saved.items():
        logging.getLogger(name or None).setLevel(level)


def test_values_are_normalised_and_bad_ones_named() -> None:
    got = validate_node_configs(
        {"log.level": "WARN", "log.level.strom.storage.replication": " Debug "}
    )
    assert got == {"log.level": "warning", "log.level.strom.storage.replication": "debug"}
    for configs, words in [
        ({"log.level": "verbose"}, "config 'log.level' has invalid value 'verbose'"),
        ({"log.level.": "info"}, "config 'log.level.' names no logger"),
        ({"log.level.a..b": "info"}, "names no logger"),
        ({"log.level.a b": "info"}, "names no logger"),
        ({"loglevel": "info"}, "unknown dynamic node config 'loglevel'"),
        # Python's name of the root logger: a second config for one logger could not be
        # restored (found from outside: deleting both left every service at the wrong level).
        ({"log.level.root": "error"}, "names the root logger: set log.level instead"),
    ]:
        with pytest.raises(ConfigError) as info:
            validate_node_configs(configs)
        assert words in str(info.value), info.value
    with pytest.raises(ConfigError) as info:
        validate_node_configs({"x": "1"})
    assert "log.level.<logger>" in str(info.value)  # the known names, patterns included


def test_levels_follow_the_configs_and_deleting_restores_the_start(lines: _Lines) -> None:
    logging.getLogger("t.b").setLevel(logging.ERROR)  # a level of its own before
    levels = DynamicLogLevels()
    assert levels.apply({"log.level": "debug", "log.level.t.a": "warning", "log.level.t.b": "info"})
    assert ROOT.level == logging.DEBUG
    assert logging.getLogger("t.a").level == logging.WARNING
    assert logging.getLogger("t.b").level == logging.INFO
    assert logging.getLogger("t.a.child").getEffectiveLevel() == logging.WARNING
    assert not levels.apply(
        {"log.level": "debug", "log.level.t.a": "warning", "log.level.t.b": "info"}
    )
    assert levels.apply({"log.level.t.a": "error", "leader.replication.throttled.rate": "5"})
    assert ROOT.level == logging.INFO  # as at start
    assert logging.getLogger("t.a").level == logging.ERROR
    assert logging.getLogger("t.b").level == logging.ERROR  # its own level again
    assert levels.apply({})
    assert logging.getLogger("t.a").level == logging.NOTSET  # inherits again
    assert ROOT.level == logging.INFO
    assert any("root=debug" in x and "t.a=warning" in x for x in lines.lines), lines.lines
    assert any("root=info (as at start)" in x for x in lines.lines), lines.lines


def test_the_change_is_logged_even_when_it_quiets_the_service(lines: _Lines) -> None:
    levels = DynamicLogLevels()
    levels.apply({"log.level": "error"})
    assert ROOT.level == logging.ERROR
    assert lines.lines == ["log levels changed by the dynamic configs: root=error"]
    logging.getLogger("strom.service").info("an info line")
    assert len(lines.lines) == 1  # the new level holds


def test_the_change_is_logged_in_a_service_started_at_warning(lines: _Lines) -> None:
    """Found from outside: a service started at warn logged no change of its levels."""
    ROOT.setLevel(logging.WARNING)
    levels = DynamicLogLevels()
    levels.apply({"log.level.t.a": "debug"})
    levels.apply({"log.level": "error"})
    assert lines.lines == [
        "log levels changed by the dynamic configs: t.a=debug",
        "log levels changed by the dynamic configs: root=error, t.a=inherited (as at start)",
    ]


def test_a_stored_value_that_does_not_parse_is_skipped_not_fatal(lines: _Lines) -> None:
    levels = DynamicLogLevels()
    assert levels.apply({"log.level": "chatty", "log.level.t.a": "debug"})
    assert ROOT.level == logging.INFO
    assert logging.getLogger("t.a").level == logging.DEBUG
    assert any("ignored a dynamic log-level config" in x for x in lines.lines), lines.lines
