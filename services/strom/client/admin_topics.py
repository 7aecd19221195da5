"""The Admin client's topic calls (the controller's CreateTopics, DeleteTopics, Metadata and
CreatePartitions), mixed into :class:`strom.client.admin.Admin` as :class:`TopicsAdmin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from strom.api import controller_pb2
from strom.client.admin_calls import AdminCalls
from strom.client.admin_requests import (
    NONE,
    config_strings,
    positive_count,
    raise_first,
    replica_assignments,
    topic_description,
    topic_error,
    topic_name,
    topic_names,
)
from strom.client.admin_types import (
    Assignment,
    ConfigValue,
    CreateTopicResult,
    NewTopic,
    TopicDescription,
    TopicListing,
)
from strom.client.kwnames import bool_option
from strom.errors import (
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
)


class TopicsAdmin(AdminCalls):
    """Topics and their partition counts (the controller's CreateTopics, DeleteTopics, ...)."""

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: Mapping[str, ConfigValue] | None = None,
        *,
        replica_assignment: Assignment | None = None,
        validate_only: bool = False,
    ) -> CreateTopicResult:
        """Create a topic; None counts take the cluster defaults.

        Raises TopicAlreadyExistsError, InvalidTopicError, InvalidPartitionsError,
        InvalidReplicationFactorError (more replicas than live nodes), InvalidConfigError, ...
        With ``validate_only`` nothing is created, but the result shows the counts it would get.
        """
        topic = NewTopic(
            topic_name(name), partitions, replication_factor, config or {}, replica_assignment
        )
        return self.create_topics([topic], validate_only=validate_only)[name]

    def create_topics(
        self, new_topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, CreateTopicResult]:
        """Create several topics in one request; raises the first failure (the others are
        created anyway)."""
        items = []
        for t in new_topics:
            if not isinstance(t, NewTopic):
                raise InvalidRequestError(f"create_topics takes NewTopic items, not {t!r}")
            name = topic_name(t.name)
            assignments = replica_assignments(t.replica_assignment, name)
            if assignments and (t.partitions is not None or t.replication_factor is not None):
                raise InvalidReplicaAssignmentError(
                    f"topic {name!r}: give either replica_assignment or partitions and "
                    "replication_factor, not both"
                )
            items.append(
                controller_pb2.CreatableTopic(
                    name=name,
                    num_partitions=positive_count(
                        t.partitions, f"topic {name!r}: partitions", InvalidPartitionsError
                    ),
                    replication_factor=positive_count(
                        t.replication_factor,
                        f"topic {name!r}: replication_factor",
                        InvalidReplicationFactorError,
                    ),
                    assignments=assignments,
                    configs=config_strings(t.config),
                )
            )
        topic_names([i.name for i in items], "create_topics")
        if not items:
            return {}
        resp = self._controller(
            "CreateTopics",
            controller_pb2.CreateTopicsRequest(
                topics=items,
                timeout_ms=self._server_wait_ms,
                validate_only=bool_option("validate_only", validate_only),
            ),
        )
        out: dict[str, CreateTopicResult] = {}
        failures = []
        for r in resp.topics:
            if r.error_code != NONE:
                failures.append((r.name, topic_error(r.error_code, r.error_message, r.name)))
            else:
                out[r.name] = CreateTopicResult(
                    r.name, r.topic_id, r.num_partitions, r.replication_factor
                )
        raise_first(failures)
        return out

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data (UnknownTopicOrPartitionError if there is none)."""
        self.delete_topics([name])

    def delete_topics(self, names: Iterable[str]) -> None:
        """Delete several topics; raises the first failure (the others are deleted anyway)."""
        topics = topic_names(names, "delete_topics")
        if not topics:
            return
        resp = self._controller(
            "DeleteTopics",
            controller_pb2.DeleteTopicsRequest(topics=topics, timeout_ms=self._server_wait_ms),
        )
        raise_first(
            [
                (r.name, topic_error(r.error_code, r.error_message, r.name))
                for r in resp.topics
                if r.error_code != NONE
            ]
        )

    def list_topics(self, internal: bool = False) -> dict[str, TopicListing]:
        """Topics by name, sorted; internal ones (``__consumer_offsets``) only if asked.

        A dict so that ``"orders" in admin.list_topics()`` and ``list(admin.list_topics())``
        read like a list of names while the id and partition count are at hand.
        """
        resp = self._controller(
            "ListTopics",
            controller_pb2.ListTopicsRequest(include_internal=bool_option("internal", internal)),
        )
        return {
            t.name: TopicListing(t.name, t.topic_id, t.partition_count, t.internal)
            for t in sorted(resp.topics, key=lambda t: t.name)
        }

    def describe_topic(self, name: str) -> TopicDescription:
        """Topic id, overrides and every partition's leader, ISR and reassignment state."""
        return self.describe_topics([name])[name]

    def describe_topics(self, names: Iterable[str] | None = None) -> dict[str, TopicDescription]:
        """Several topics by name (None = every topic, internal ones included, sorted); raises
        the first unknown one."""
        topics = [] if names is None else topic_names(names, "describe_topics")
        if names is not None and not topics:
            return {}
        resp = self._controller(
            "DescribeTopics", controller_pb2.DescribeTopicsRequest(topics=topics)
        )
        raise_first(
            [
                (t.name, topic_error(t.error_code, t.error_message, t.name))
                for t in resp.topics
                if t.error_code != NONE
            ]
        )
        found = {t.name: topic_description(t) for t in resp.topics}
        order = topics or sorted(found)
        return {n: found[n] for n in order if n in found}

    def create_partitions(
        self,
        name: str,
        new_total: int,
        *,
        replica_assignment: Mapping[int, Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> None:
        """Grow a topic to ``new_total`` partitions (counts only grow: InvalidPartitionsError).

        Keys already written keep their partitions, so per-key order across the change is not
        kept for keyed records (as in Kafka). ``replica_assignment`` places the new partitions
        only, keyed by their partition numbers, not by a 0-based index among the new ones:
        growing from 1 to 3 partitions takes ``{1: [3, 1], 2: [1, 2]}`` (node ids, preferred
        leader first; every new partition listed, each with the topic's replication factor).
        """
        topic = topic_name(name)
        total = positive_count(
            new_total,
            f"topic {topic!r}: new partition count",
            InvalidPartitionsError,
            default_ok=False,
        )
        if replica_assignment is not None and not isinstance(replica_assignment, Mapping):
            raise InvalidReplicaAssignmentError(
                f"topic {topic!r}: replica_assignment must map each new partition's number "
                "-> node ids"
            )
        resp = self._controller(
            "CreatePartitions",
            controller_pb2.CreatePartitionsRequest(
                topics=[
                    controller_pb2.CreatePartitionsTopic(
                        name=topic,
                        count=total,
                        assignments=replica_assignments(replica_assignment, topic),
                    )
                ],
                timeout_ms=self._server_wait_ms,
                validate_only=bool_option("validate_only", validate_only),
            ),
        )
        raise_first(
            [
                (r.name, topic_error(r.error_code, r.error_message, r.name))
                for r in resp.topics
                if r.error_code != NONE
            ]
        )
