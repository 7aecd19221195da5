"""DescribeConfigs and AlterConfigs semantics for topics (a pure engine: no gRPC, no etcd).

Only overrides are stored in ``TopicMetadata.configs``; everything else takes the default from
:data:`strom.log.config.CONFIG_KEYS`. Describing therefore overlays the overrides on the
defaults and says which is which; altering applies Kafka's incremental operations (set,
delete, append, subtract) to the overrides and validates the result as a whole, so a change is
applied all or nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from strom.api import controller_pb2 as pb
from strom.controller.validation import validate_topic_configs
from strom.errors import InvalidConfigError, InvalidRequestError
from strom.log.config import CONFIG_KEYS, check_name, format_value
from strom.log.errors import ConfigError

#: Configs whose value is a comma-separated list (APPEND / SUBTRACT apply to them).
LIST_CONFIGS: frozenset[str] = frozenset({"cleanup.policy"})


def format_default(value: Any) -> str:
    """A default as it would be stored (booleans in lowercase, like normalised overrides)."""
    return format_value(value)


def describe_topic_configs(
    overrides: Mapping[str, str],
    names: Collection[str] = (),
    *,
    include_documentation: bool = False,
) -> list[pb.ConfigEntry]:
    """Effective topic configs sorted by name: each override (source TOPIC) or default.

    ``names`` restricts the result (empty = all); names strom does not know are left out, as
    Kafka does. Overrides under names this version does not know (written by a newer
    controller) are still shown, as topic overrides.
    """
    wanted = set(names)
    out: list[pb.ConfigEntry] = []
    for name in sorted(set(CONFIG_KEYS) | set(overrides)):
        if wanted and name not in wanted:
            continue
        key = CONFIG_KEYS.get(name)
        if name in overrides:
            value, source = overrides[name], pb.CONFIG_SOURCE_TOPIC
        else:
            assert key is not None
            value, source = format_default(key.default), pb.CONFIG_SOURCE_DEFAULT
        entry = pb.ConfigEntry(name=name, value=value, source=source)
        if include_documentation and key is not None:
            entry.documentation = key.doc
        out.append(entry)
    return out


def _effective(overrides: Mapping[str, str], name: str) -> str:
    if name in overrides:
        return overrides[name]
    return format_default(CONFIG_KEYS[name].default)


def apply_config_ops(
    overrides: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]]
) -> dict[str, str]:
    """Apply incremental changes to a topic's overrides; return the new, validated overrides.

    ``ops`` are (name, AlterConfigOp, value or None). APPEND and SUBTRACT start from the
    effective value (the default when there is no override), as in Kafka.

    Raises:
        InvalidRequestError: a name given twice, an unknown op.
        InvalidConfigError: an unknown name, a missing value, APPEND/SUBTRACT on a config that
            is not a list, or a resulting value that is invalid (the message names the key).
    """
    result = dict(overrides)
    seen: set[str] = set()
    for name, op, value in ops:
        if name in seen:
            raise InvalidRequestError(f"config '{name}' is changed more than once in the request")
        seen.add(name)
        try:
            check_name(name)
        except ConfigError as exc:
            # Kafka's names strom does not apply are refused with the reason, others as unknown.
            raise InvalidConfigError(str(exc)) from None
        if op == pb.ALTER_CONFIG_OP_DELETE:
            result.pop(name, None)
            continue
        if op not in (
            pb.ALTER_CONFIG_OP_SET,
            pb.ALTER_CONFIG_OP_APPEND,
            pb.ALTER_CONFIG_OP_SUBTRACT,
        ):
            raise InvalidRequestError(f"unknown config operation {op} for '{name}'")
        if value is None:
            raise InvalidConfigError(
                f"config '{name}' needs a value for {pb.AlterConfigOp.Name(op)}"
            )
        if op == pb.ALTER_CONFIG_OP_SET:
            result[name] = value
            continue
        if name not in LIST_CONFIGS:
            raise InvalidConfigError(
                f"config '{name}' is not a list, so {pb.AlterConfigOp.Name(op)} does not apply "
                "(use SET)"
            )
        items = [v.strip() for v in _effective(result, name).split(",") if v.strip()]
        given = [v.strip() for v in value.split(",") if v.strip()]
        if op == pb.ALTER_CONFIG_OP_APPEND:
            items += [v for v in given if v not in items]
        else:
            items = [v for v in items if v not in given]
        result[name] = ",".join(items)
    return validate_topic_configs(result)
