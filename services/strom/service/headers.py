"""gRPC metadata (header) names that strom's services send each other."""

from __future__ import annotations

from typing import Any

#: Marks a call from strom's own group and transaction coordinators, the only writers of the
#: internal ``__`` topics (``__consumer_offsets``, ``__transaction_state``): it lets
#: CreateTopics create topics in that namespace, Produce append to them and AlterConfigs
#: change them, all of which clients may not (as Kafka's brokers refuse them to every client
#: but their own coordinators, whose internal client id marks them). It guards against
#: mistakes, not attacks: with ACLs on, writing an internal topic also needs CLUSTER_ACTION
#: (strom.security.rules), which only the services' own principals have.
INTERNAL_TOPICS_METADATA_KEY = "strom-internal-topics"


def is_internal_call(context: Any) -> bool:
    """Whether a gRPC call carries :data:`INTERNAL_TOPICS_METADATA_KEY` (False without a
    context: an in-process caller is a client's proxy, RecordService)."""
    if context is None:
        return False
    try:
        metadata = context.invocation_metadata() or ()
    except Exception:
        return False
    return any(k == INTERNAL_TOPICS_METADATA_KEY and str(v).lower() == "true" for k, v in metadata)
