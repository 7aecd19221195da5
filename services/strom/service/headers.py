"""gRPC metadata (header) names that strom's services send each other."""

from __future__ import annotations

#: Lets a CreateTopics caller create topics in the internal ``__`` namespace (the group
#: coordinator creating ``__consumer_offsets`` and ``__transaction_state``, which clients may
#: not). CreatableTopic has no field for it yet.
INTERNAL_TOPICS_METADATA_KEY = "strom-internal-topics"
