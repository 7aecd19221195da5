"""The controller's config RPCs: DescribeConfigs (topics and nodes) and AlterConfigs
(topics, and the dynamic configs every node applies: the NODE resource named "", stored in
``node_configs``: the replication throttle rates and the log levels; a node's own configs
are static)
(DESIGN §3, §6).

What a config key means, its default and how an override is validated live in
:mod:`strom.controller.configs` and :mod:`strom.log.config`; this module reads topics from
the view and writes their overrides with CAS on the topic key.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Mapping

import grpc

from strom.api import controller_pb2 as pb
from strom.api import metadata_pb2 as md
from strom.controller.cas import commit_with_retry
from strom.controller.configs import apply_config_ops, describe_topic_configs
from strom.controller.core import ControllerCore, Leadership, item_error, rack_of, rpc
from strom.controller.validation import check_throttled_partitions, is_internal_topic
from strom.errors import (
    BrokerNotAvailableError,
    ErrorCode,
    InvalidConfigError,
    InvalidRequestError,
    InvalidTopicError,
    StromError,
    UnknownTopicOrPartitionError,
)
from strom.log.errors import ConfigError
from strom.metadata import Versioned
from strom.service import node_configs as dynamic_node_configs
from strom.service.headers import is_internal_call
from strom.service.node_configs import NODE_CONFIGS, validate_node_configs

log = logging.getLogger("strom.controller")
E = ErrorCode


#: Configs of an internal topic (``__consumer_offsets``, ``__transaction_state``) that only
#: strom's coordinators set: everything else in them is compacted state.
INTERNAL_TOPIC_FIXED_CONFIGS = frozenset({"cleanup.policy"})


class ConfigRpcs(ControllerCore):
    """DescribeConfigs and AlterConfigs."""

    @rpc(write=False)
    async def DescribeConfigs(
        self,
        lead: Leadership,
        request: pb.DescribeConfigsRequest,
        response: pb.DescribeConfigsResponse,
    ) -> None:
        assert self.view is not None
        for res in request.resources:
            result = response.results.add(
                resource_type=res.resource_type, resource_name=res.resource_name
            )
            try:
                entries = self._describe_resource(res, request.include_documentation)
                result.configs.extend(entries)
            except StromError as exc:
                item_error(result, exc)

    def _describe_resource(
        self, res: pb.DescribeConfigsResource, include_documentation: bool
    ) -> list[pb.ConfigEntry]:
        assert self.view is not None
        if res.resource_type == pb.RESOURCE_TYPE_TOPIC:
            topic = self._topic_visible(res.resource_name)
            if topic is None:
                raise UnknownTopicOrPartitionError(f"topic {res.resource_name!r} does not exist")
            return describe_topic_configs(
                dict(topic.configs),
                list(res.config_names),
                include_documentation=include_documentation,
            )
        if res.resource_type == pb.RESOURCE_TYPE_NODE:
            if res.resource_name == "":
                return self._dynamic_node_configs(list(res.config_names), include_documentation)
            if not res.resource_name.isdigit():
                raise InvalidRequestError(
                    f"node resource name must be a node id in decimal (or '' for every "
                    f"node's dynamic configs), not {res.resource_name!r}"
                )
            node = self.view.live_nodes().get(int(res.resource_name))
            if node is None:
                raise BrokerNotAvailableError(f"node {res.resource_name} is not registered")
            return self._node_configs(node, list(res.config_names), include_documentation)
        raise InvalidRequestError(
            f"resource type {res.resource_type} is not supported (use TOPIC or NODE)"
        )

    def _dynamic_node_configs(
        self, names: list[str], include_documentation: bool
    ) -> list[pb.ConfigEntry]:
        """The dynamic configs every node applies (``node_configs``): each one set, and the
        known ones unset (no value: no limit), sorted by name."""
        assert self.view is not None
        with self.view.lock:
            v = self.view.node_configs
            stored = dict(v.value.configs) if v is not None else {}
        out = []
        for name in sorted(set(NODE_CONFIGS) | set(stored)):
            if names and name not in names:
                continue
            entry = pb.ConfigEntry(name=name)
            if name in stored:
                entry.value = stored[name]
                entry.source = pb.CONFIG_SOURCE_DYNAMIC_DEFAULT_NODE_CONFIG
            else:
                entry.source = pb.CONFIG_SOURCE_DEFAULT
            if include_documentation:
                entry.documentation = dynamic_node_configs.documentation(name)
            out.append(entry)
        return out

    @staticmethod
    def _node_configs(
        node: md.NodeRegistration, names: list[str], include_documentation: bool
    ) -> list[pb.ConfigEntry]:
        """What the controller knows of a node's static config: its registration."""
        values: dict[str, tuple[str | None, str]] = {
            "advertised.host": (node.host, "host clients and other nodes connect to"),
            "metrics.port": (str(node.metrics_port), "Prometheus /metrics HTTP port"),
            "node.id": (str(node.node_id), "the node's id, stable across restarts"),
            "port": (str(node.port), "gRPC port of the storage service"),
            "rack": (rack_of(node), "rack or availability zone, for rack-aware placement"),
            "software.version": (node.software_version, "strom version the node runs"),
        }
        out = []
        for name in sorted(values):
            if names and name not in names:
                continue
            value, doc = values[name]
            entry = pb.ConfigEntry(
                name=name, source=pb.CONFIG_SOURCE_STATIC_NODE_CONFIG, read_only=True
            )
            if value is not None:
                entry.value = value
            if include_documentation:
                entry.documentation = doc
            out.append(entry)
        return out

    @rpc(write=True, with_context=True)
    async def AlterConfigs(
        self,
        lead: Leadership,
        request: pb.AlterConfigsRequest,
        response: pb.AlterConfigsResponse,
        context: grpc.aio.ServicerContext,
    ) -> None:
        internal_ok = is_internal_call(context)
        view = self._live_view
        changed: dict[str, dict[str, str]] = {}
        node_configs: dict[str, str] | None = None
        for res in request.resources:
            result = response.results.add(
                resource_type=res.resource_type, resource_name=res.resource_name
            )
            try:
                internal = res.resource_type == pb.RESOURCE_TYPE_TOPIC and is_internal_topic(
                    res.resource_name
                )
                fixed = sorted({c.name for c in res.configs} & INTERNAL_TOPIC_FIXED_CONFIGS)
                if internal and not internal_ok and fixed:
                    # The coordinators' state relies on compaction (cleanup.policy=delete
                    # would drop committed offsets and transaction states), as DeleteRecords
                    # is refused on it. Other settings (min.insync.replicas, segment.bytes,
                    # ...) are an operator's to tune, as in Kafka.
                    raise InvalidTopicError(
                        f"topic {res.resource_name!r} is internal: {', '.join(fixed)} is "
                        "strom's coordinators' to set (other configs may be changed)"
                    )
                dynamic = res.resource_type == pb.RESOURCE_TYPE_NODE and not res.resource_name
                alter = self._alter_node_configs if dynamic else self._alter_topic_configs
                new = await asyncio.to_thread(alter, lead, res, request.validate_only)
                if new is not None and dynamic:
                    node_configs = new
                elif new is not None:
                    changed[res.resource_name] = new
            except StromError as exc:
                item_error(result, exc)
        if changed:
            await self._await_view(
                lambda: all(
                    (v := view.topics.get(n)) is not None and dict(v.value.configs) == c
                    for n, c in changed.items()
                ),
                f"new configs of {sorted(changed)}",
            )
        if node_configs is not None:
            want = node_configs
            await self._await_view(
                lambda: dict(view.node_configs.value.configs if view.node_configs else {}) == want,
                "new dynamic node configs",
            )

    def _alter_topic_configs(
        self, lead: Leadership, res: pb.AlterConfigsResource, validate_only: bool
    ) -> dict[str, str] | None:
        """Apply one resource's changes with CAS (blocking); the new overrides, or None."""
        assert self.store is not None
        if res.resource_type == pb.RESOURCE_TYPE_NODE:
            raise InvalidRequestError(
                "a node's static configs cannot be altered; the dynamic ones (replication "
                "throttle rates) are set for every node, on the NODE resource named ''"
            )
        if res.resource_type != pb.RESOURCE_TYPE_TOPIC:
            raise InvalidRequestError(
                f"resource type {res.resource_type} cannot be altered (use TOPIC)"
            )
        store, key = self.store, self.store.keys.topic(res.resource_name)
        ops = [(c.name, c.op, c.value if c.HasField("value") else None) for c in res.configs]

        def decide() -> tuple[Versioned, dict[str, str]]:
            current = store.get(key, md.TopicMetadata)
            if current is None or current.value.deleting:
                raise UnknownTopicOrPartitionError(f"topic {res.resource_name!r} does not exist")
            new = apply_config_ops(dict(current.value.configs), ops)
            check_throttled_partitions(res.resource_name, new, current.value.partition_count)
            return current, new

        def commit(decision: tuple[Versioned, dict[str, str]]) -> bool:
            if validate_only:
                return True  # checked, nothing to write
            current, new = decision
            updated = md.TopicMetadata()
            updated.CopyFrom(current.value)
            updated.ClearField("configs")
            updated.configs.update(new)
            return self._txn(lead, [(key, current.mod_revision)], puts=[(key, updated)])

        before, new = commit_with_retry(
            decide, commit, attempts=5, gave_up=f"topic {res.resource_name!r} kept changing; retry"
        )
        if validate_only:
            return None
        log_config_change(f"topic {res.resource_name}", dict(before.value.configs), new)
        return new

    def _alter_node_configs(
        self, lead: Leadership, res: pb.AlterConfigsResource, validate_only: bool
    ) -> dict[str, str] | None:
        """Apply changes to the nodes' dynamic configs with CAS on ``node_configs``
        (blocking); the new configs, or None. Only SET and DELETE: each holds one value."""
        assert self.store is not None
        store, key = self.store, self.store.keys.node_configs

        def decide() -> tuple[Versioned | None, dict[str, str]]:
            current = store.get(key, md.NodeConfigs)
            configs = dict(current.value.configs) if current is not None else {}
            return current, apply_node_config_ops(configs, res.configs)

        def commit(decision: tuple[Versioned | None, dict[str, str]]) -> bool:
            if validate_only:
                return True
            current, new = decision
            revision = current.mod_revision if current is not None else 0
            value = md.NodeConfigs(configs=new)
            return self._txn(lead, [(key, revision)], puts=[(key, value)])

        before, new = commit_with_retry(
            decide, commit, attempts=5, gave_up="the nodes' dynamic configs kept changing; retry"
        )
        if validate_only:
            return None
        old = dict(before.value.configs) if before is not None else {}
        log_config_change("the dynamic node configs", old, new)
        return new


#: A config whose name contains one of these holds a secret: its value is never logged.
_SECRET_CONFIG = re.compile(r"password|secret|credential|token", re.IGNORECASE)


def _shown(name: str, value: str) -> str:
    return "<hidden>" if _SECRET_CONFIG.search(name) else value


def config_changes(
    before: Mapping[str, str], after: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """(what was set: name -> new value, secrets hidden; the names removed), sorted."""
    changed = {k: _shown(k, v) for k, v in sorted(after.items()) if before.get(k) != v}
    return changed, sorted(k for k in before if k not in after)


def log_config_change(what: str, before: Mapping[str, str], after: Mapping[str, str]) -> None:
    """One INFO line saying what an AlterConfigs set and removed (the configs left
    afterwards would not show a removed override)."""
    changed, removed = config_changes(before, after)
    parts = []
    if changed:
        parts.append("set " + ", ".join(f"{k}={v}" for k, v in changed.items()))
    if removed:
        parts.append("removed " + ", ".join(removed))
    log.info(
        "altered configs of %s: %s",
        what,
        "; ".join(parts) or "nothing changed",
        extra={
            "fields": {
                "resource": what,
                "set": changed,
                "removed": removed,
                "configs": {k: _shown(k, v) for k, v in sorted(after.items())},
            }
        },
    )


def apply_node_config_ops(
    configs: dict[str, str], ops: Iterable[pb.AlterableConfig]
) -> dict[str, str]:
    """The dynamic node configs after SET / DELETE ``ops``, the values set validated and
    normalised (InvalidConfigError naming the config; InvalidRequestError for a name given
    twice or a list operation)."""
    result = dict(configs)
    seen: set[str] = set()
    for c in ops:
        if c.name in seen:
            raise InvalidRequestError(f"config '{c.name}' is changed more than once in the request")
        seen.add(c.name)
        if not dynamic_node_configs.is_known(c.name):
            raise InvalidConfigError(str(dynamic_node_configs.unknown(c.name)))
        if c.op == pb.ALTER_CONFIG_OP_DELETE:
            result.pop(c.name, None)
        elif c.op == pb.ALTER_CONFIG_OP_SET:
            if not c.HasField("value"):
                raise InvalidConfigError(f"config '{c.name}' needs a value for SET")
            result[c.name] = c.value
        else:
            raise InvalidRequestError(
                f"config '{c.name}' holds one value: use SET or DELETE, not "
                f"{pb.AlterConfigOp.Name(c.op) if c.op in pb.AlterConfigOp.values() else c.op}"
            )
    try:
        # Only what this request sets: a value stored by another writer that does not
        # parse must not make every later change fail naming it (the services skip such a
        # value with a warning).
        result.update(validate_node_configs({n: result[n] for n in seen if n in result}))
    except ConfigError as exc:
        raise InvalidConfigError(str(exc)) from None
    return result
