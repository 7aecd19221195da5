"""The cluster's dynamic node configs (the ``node_configs`` etcd key, Kafka's default broker
entity): which names exist, what they mean, and how their values are checked.

Two kinds, applied by different parts: the replication throttle rates
(:mod:`strom.storage.replication_quota`, storage nodes only) and the log levels
(:mod:`strom.service.log_levels`, every service of the cluster). The controller validates a
change against this module before it writes it; the services read the stored values leniently
(a value they cannot parse counts as unset), so a newer writer never stops an older reader.
"""

from __future__ import annotations

from collections.abc import Mapping

from strom.log.errors import ConfigError
from strom.service import log_levels
from strom.storage.replication_quota import RATE_CONFIGS, parse_rate

#: The configs with a fixed name, and their meaning (``log.level.<logger>`` are the others).
NODE_CONFIGS: dict[str, str] = {
    **RATE_CONFIGS,
    log_levels.ROOT_LEVEL: log_levels.DOCUMENTATION[log_levels.ROOT_LEVEL],
}


def documentation(name: str) -> str:
    """What a dynamic node config means ("" for an unknown name)."""
    if name in NODE_CONFIGS:
        return NODE_CONFIGS[name]
    if log_levels.is_log_level_config(name):
        return log_levels.DOCUMENTATION[log_levels.LOGGER_LEVEL_PREFIX + "<logger>"]
    return ""


def is_known(name: str) -> bool:
    return name in NODE_CONFIGS or log_levels.is_log_level_config(name)


def known_names() -> str:
    """The names, for an error message."""
    return ", ".join([*sorted(NODE_CONFIGS), log_levels.LOGGER_LEVEL_PREFIX + "<logger>"])


def unknown(name: str) -> ConfigError:
    return ConfigError(f"unknown dynamic node config '{name}' (known: {known_names()})")


def validate_node_configs(configs: Mapping[str, object]) -> dict[str, str]:
    """Validate dynamic node configs; the normalised strings to store. ConfigError names
    the first unknown config or bad value."""
    out: dict[str, str] = {}
    for name, raw in configs.items():
        if log_levels.is_log_level_config(name):
            out[name] = log_levels.parse_level(name, raw)
        elif name in RATE_CONFIGS:
            out[name] = str(parse_rate(name, raw))
        else:
            raise unknown(name)
    return out
