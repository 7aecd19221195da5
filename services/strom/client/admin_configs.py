"""The Admin client's DescribeConfigs and AlterConfigs on topics and nodes, mixed into
:class:`strom.client.admin.Admin` as :class:`ConfigsAdmin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from strom.api import controller_pb2
from strom.client.admin_calls import AdminCalls
from strom.client.admin_requests import (
    NONE,
    config_entries,
    config_strings,
    raise_first,
    topic_error,
    topic_name,
    with_context,
)
from strom.client.admin_types import ConfigEntry, ConfigValue
from strom.client.kwnames import bool_option
from strom.errors import InvalidConfigError, InvalidRequestError, error_for


class ConfigsAdmin(AdminCalls):
    """Resource configs: DescribeConfigs and AlterConfigs (incremental or whole)."""

    def describe_configs(
        self,
        topic: str | None = None,
        *,
        node: int | None = None,
        names: Iterable[str] | None = None,
        documentation: bool = False,
    ) -> dict[str, ConfigEntry]:
        """Effective configs of a topic (overrides and defaults) or a storage node (static,
        read-only), by name. ``names`` restricts the result; unknown names are left out."""
        if (topic is None) == (node is None):
            raise InvalidRequestError("describe_configs needs exactly one of topic= or node=")
        if topic is not None:
            res = controller_pb2.DescribeConfigsResource(
                resource_type=controller_pb2.RESOURCE_TYPE_TOPIC, resource_name=topic_name(topic)
            )
            what = f"topic {topic!r}"
        else:
            if not isinstance(node, int) or isinstance(node, bool) or node < 0:
                raise InvalidRequestError(f"node must be a node id (int >= 0), not {node!r}")
            res = controller_pb2.DescribeConfigsResource(
                resource_type=controller_pb2.RESOURCE_TYPE_NODE, resource_name=str(node)
            )
            what = f"node {node}"
        if names is not None:
            if isinstance(names, str):
                names = [names]
            res.config_names.extend(names)
        resp = self._controller(
            "DescribeConfigs",
            controller_pb2.DescribeConfigsRequest(
                resources=[res],
                include_documentation=bool_option("documentation", documentation),
            ),
        )
        out: dict[str, ConfigEntry] = {}
        for r in resp.results:
            if r.error_code != NONE:
                raise with_context(
                    error_for(r.error_code, r.error_message or None),
                    what,
                    repr(r.resource_name) if topic is not None else f"node {r.resource_name}",
                )
            out.update(config_entries(r.configs))
        return out

    def alter_configs(
        self,
        topic: str,
        set: Mapping[str, ConfigValue] | None = None,  # shadows the builtin: Kafka's op name
        delete: Iterable[str] | None = None,
        *,
        append: Mapping[str, ConfigValue] | None = None,
        subtract: Mapping[str, ConfigValue] | None = None,
        validate_only: bool = False,
    ) -> None:
        """Change a topic's configs incrementally, all or nothing: ``set`` overrides values,
        ``delete`` removes overrides (the default applies again), ``append`` / ``subtract`` add
        or remove items of list configs (``cleanup.policy``). Other configs stay as they are.

        Unknown names and invalid values raise InvalidConfigError naming the config.
        """
        name = topic_name(topic)
        ops: list[controller_pb2.AlterableConfig] = []
        seen: dict[str, str] = {}

        def add(key: str, op: int, value: str | None, how: str) -> None:
            if not isinstance(key, str) or not key:
                raise InvalidConfigError(f"config names must be non-empty strings, not {key!r}")
            if key in seen:
                raise InvalidRequestError(
                    f"topic {name!r}: config '{key}' is given to both {seen[key]} and {how}"
                )
            seen[key] = how
            entry = controller_pb2.AlterableConfig(name=key, op=op)
            if value is not None:
                entry.value = value
            ops.append(entry)

        for how, op, values in (
            ("set", controller_pb2.ALTER_CONFIG_OP_SET, set),
            ("append", controller_pb2.ALTER_CONFIG_OP_APPEND, append),
            ("subtract", controller_pb2.ALTER_CONFIG_OP_SUBTRACT, subtract),
        ):
            for key, value in config_strings(values).items():
                add(key, op, value, how)
        if isinstance(delete, str):
            delete = [delete]
        for key in delete or []:
            add(key, controller_pb2.ALTER_CONFIG_OP_DELETE, None, "delete")
        resp = self._controller(
            "AlterConfigs",
            controller_pb2.AlterConfigsRequest(
                resources=[
                    controller_pb2.AlterConfigsResource(
                        resource_type=controller_pb2.RESOURCE_TYPE_TOPIC,
                        resource_name=name,
                        configs=ops,
                    )
                ],
                validate_only=bool_option("validate_only", validate_only),
            ),
        )
        raise_first(
            [
                (r.resource_name, topic_error(r.error_code, r.error_message, r.resource_name))
                for r in resp.results
                if r.error_code != NONE
            ]
        )
