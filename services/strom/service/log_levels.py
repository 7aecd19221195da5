"""Log levels changed at run time, through the cluster's dynamic configs.

Kafka lets an operator turn a running broker's loggers up or down without a restart
(``kafka-configs --entity-type broker-loggers --alter --add-config
kafka.server.ReplicaManager=DEBUG``); strom's services took their level at start only
(``--log-level``), so looking closer at an incident meant restarting the very process that
showed it, which often ends the incident.

The configs live with the other dynamic node configs (the ``node_configs`` etcd key, set with
``strom cluster configs --set`` / ``Admin.alter_node_configs``), and every service of the
cluster follows them through its metadata watch — storage nodes, controllers and
coordinators alike:

- ``log.level``: the level of the root logger, which the service started at ``--log-level``;
- ``log.level.<logger>``: one logger and those under it (``log.level.strom.storage.replication``,
  ``log.level.grpc``).

Values are the start flag's levels (``debug``, ``info``, ``warning``/``warn``, ``error``).
Deleting a config puts that logger back as it was at start. Each change is logged at INFO
whatever the levels (:func:`strom.service.runtime.always_info`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping

from strom.log.errors import ConfigError
from strom.metadata.view import RESYNC, ClusterView, WatchEvent
from strom.service.flags import LOG_LEVELS, log_level
from strom.service.runtime import always_info

log = logging.getLogger("strom.service")

#: The root logger's level.
ROOT_LEVEL = "log.level"
#: ``log.level.<logger>``: one logger's level.
LOGGER_LEVEL_PREFIX = "log.level."
#: A logger's name: dotted parts of letters, digits, ``_`` and ``-``.
_LOGGER_NAME = re.compile(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")

DOCUMENTATION = {
    ROOT_LEVEL: "the log level of every strom service of the cluster (nodes, controllers, "
    "coordinators), instead of its --log-level until deleted: debug, info, warning or error",
    LOGGER_LEVEL_PREFIX + "<logger>": "one logger's level (and the loggers under it) in every "
    "service, e.g. log.level.strom.storage.replication=debug; deleted: as at start",
}


def is_log_level_config(name: str) -> bool:
    """Whether ``name`` is one of the configs this module applies."""
    return name == ROOT_LEVEL or name.startswith(LOGGER_LEVEL_PREFIX)


def parse_level(name: str, raw: object) -> str:
    """The level a log-level config ``name`` sets (lower case, ``warn`` as ``warning``);
    ConfigError naming the config when the logger's name or the level is not valid."""
    if name != ROOT_LEVEL:
        logger = name[len(LOGGER_LEVEL_PREFIX) :]
        if logger == "root":  # Python's name of the root logger: one config for it
            raise ConfigError(f"config '{name}' names the root logger: set {ROOT_LEVEL} instead")
        if not _LOGGER_NAME.fullmatch(logger):
            raise ConfigError(
                f"config '{name}' names no logger: expected {LOGGER_LEVEL_PREFIX}<logger>, "
                "the logger's dotted name (e.g. log.level.strom.storage.replication)"
            )
    level = log_level(str(raw)) if isinstance(raw, str) else ""
    if level not in LOG_LEVELS:
        raise ConfigError(
            f"config '{name}' has invalid value {raw!r}: expected one of "
            f"{', '.join(LOG_LEVELS)} (or warn)"
        )
    return level


def wanted_levels(configs: Mapping[str, str]) -> dict[str, int]:
    """Logger name ("" for the root) -> level, from the log-level configs among ``configs``.
    A stored value that does not parse (written by a newer version, say) is left out: the
    logger stays as it is rather than the watch failing."""
    out: dict[str, int] = {}
    for name, raw in configs.items():
        if not is_log_level_config(name):
            continue
        try:
            level = parse_level(name, raw)
        except ConfigError as exc:
            log.warning("ignored a dynamic log-level config: %s", exc)
            continue
        logger = "" if name == ROOT_LEVEL else name[len(LOGGER_LEVEL_PREFIX) :]
        out[logger] = logging.getLevelName(level.upper())
    return out


class DynamicLogLevels:
    """Applies the log-level configs to this process's loggers, remembering each logger's
    level from before it was first changed so that a deleted config restores it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Logger name -> its level before the configs first set it.
        self._original: dict[str, int] = {}
        #: What the configs set now.
        self._applied: dict[str, int] = {}

    def apply(self, configs: Mapping[str, str]) -> bool:
        """Set the loggers as ``configs`` say and restore those no longer named; whether
        anything changed."""
        want = wanted_levels(configs)
        with self._lock:
            changes: dict[str, int] = {}
            for name, level in want.items():
                if self._applied.get(name) != level:
                    self._original.setdefault(name, _logger(name).level)
                    changes[name] = level
            for name in self._applied.keys() - want.keys():
                changes[name] = self._original.pop(name)
            if not changes:
                return False
            self._applied = want
            _set(changes)
            _log_changes(changes, want)
            return True


def _logger(name: str) -> logging.Logger:
    return logging.getLogger(name or None)


def _set(levels: Mapping[str, int]) -> None:
    for name, level in levels.items():
        _logger(name).setLevel(level)


def _log_changes(changes: Mapping[str, int], want: Mapping[str, int]) -> None:
    shown = ", ".join(
        f"{name or 'root'}={logging.getLevelName(level).lower() if level else 'inherited'}"
        + ("" if name in want else " (as at start)")
        for name, level in sorted(changes.items())
    )
    always_info(log, "log levels changed by the dynamic configs: %s", shown)


def follow(view: ClusterView) -> DynamicLogLevels:
    """Apply the log-level configs of ``view``'s cluster when its snapshot is taken and on
    every change of ``node_configs`` (a listener on the watch thread: a level change is a
    few assignments under logging's own lock)."""
    levels = DynamicLogLevels()
    key = view.keys.node_configs

    def on_events(events: list[WatchEvent]) -> None:
        if not any(ev is RESYNC or ev.key == key for ev in events):
            return
        with view.lock:
            v = view.node_configs
            configs = dict(v.value.configs) if v is not None else {}
        levels.apply(configs)

    view.add_listener(on_events)
    return levels
