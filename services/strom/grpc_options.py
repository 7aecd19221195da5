"""The gRPC options every strom process uses for its channels and servers (message size
limits, reconnect backoff, DNS re-resolution, the servers' keepalive policy). A module of its
own so that clients need not import the service runtime (and with it etcd, Prometheus and
the health and reflection services) to read a few numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Large enough for several 1 MiB batches per partition in one request.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
#: What a Fetch answer (or a follower's replication answer) spends beside one batch's bytes:
#: the partition's fields, its aborted-transaction list, the node endpoints. Nodes keep their
#: answers this far below MAX_MESSAGE_BYTES (strom.storage.fetch_rpcs).
FETCH_ANSWER_OVERHEAD_BYTES = 1 << 20
#: The largest batch strom accepts (the ceiling of ``max.message.bytes`` and of the
#: producer's ``max_request_size``): one such batch must fit in a Fetch answer with its
#: overhead, or every reader of the partition would be stuck on it. One limit end to end:
#: what the cluster acknowledges, its readers can read.
MAX_BATCH_BYTES = MAX_MESSAGE_BYTES - FETCH_ANSWER_OVERHEAD_BYTES
#: How a strom channel backs off reconnecting to a peer it lost: from 100 ms (gRPC jitters
#: and grows it 1.6x) to at most 1 s, as Kafka's ``reconnect.backoff.ms`` (50 ms) and
#: ``reconnect.backoff.max.ms`` (1 s). gRPC's own defaults start at 1 s and grow to 120 s,
#: and calls on a channel waiting out its backoff fail at once: a channel that kept dialing
#: a node through an outage of half a minute could not reach it for another ~10 s after it
#: was back on the same address (found from outside: a follower's fetches from a restarted
#: leader failed for 13 s, and the leader shrank that healthy follower out of its ISRs).
#: gRPC shares one connection (and its backoff) between the channels of a process to one
#: address, so every channel needs the short backoff, not only the followers'.
#: ``grpc.min_reconnect_backoff_ms`` is left at gRPC's default: despite its name it is the
#: least time one connection attempt gets to complete (20 s; see strom.metadata.store).
RECONNECT_BACKOFF_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
#: How soon a strom channel may look its target's DNS name up again: 1 s, where gRPC's
#: default is 30 s. A channel resolves its name when made and again when its connection
#: breaks, but at most once per this interval; the look-up made at the break (the peer just
#: died) still finds the old address, so a peer that comes back under the same name at a new
#: IP (a Kubernetes StatefulSet pod restarted: same stable DNS name, new pod IP) was dialled
#: at its dead old IP until 30 s after it died. Found from outside: a ProduceRecords call
#: forwarded to a moved leader hung 26.5 s, a group's offset commit 18.8-29 s, the controller
#: took 24 s to accept an ISR change, though the process was back in ~4 s; channels made anew
#: followed at once. Kafka clients look a broker's name up again on every reconnect
#: (``client.dns.lookup``). A look-up a second per broken channel is nothing; servers ignore
#: the option. The etcd channels have it too (strom.metadata.store.CHANNEL_OPTIONS).
DNS_MIN_RESOLUTION_INTERVAL_MS = 1000
DNS_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.dns_min_time_between_resolutions_ms", DNS_MIN_RESOLUTION_INTERVAL_MS),
)
#: The options of every strom channel (and server): the Python clients', the services'
#: channels to each other (strom.security.channel.ChannelCache, the replica fetchers, the
#: controller's prober).
GRPC_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    *RECONNECT_BACKOFF_OPTIONS,
    *DNS_OPTIONS,
)

#: Keepalive policy of every strom gRPC server. gRPC's defaults refuse a client ping more
#: often than every 5 minutes on a connection without data (then GOAWAY "too_many_pings",
#: which @grpc/grpc-js reports as RESOURCE_EXHAUSTED on every open stream): a client with
#: keepalive on (the only way it notices a hung or partitioned node) lost its idle Subscribe
#: streams after ~40 s. Clients may ping every 10 s or more, also between calls; a client
#: pinging faster is cut off after a few strikes. The server pings too, by default every 30 s
#: on a quiet connection with 20 s to answer (``--keepalive-time-ms`` /
#: ``--keepalive-timeout-ms``, strom.service.limits.ServerLimits), so that it notices a dead
#: client of a long stream (and frees its partitions) within a minute instead of when TCP
#: gives up.
MIN_CLIENT_PING_INTERVAL_MS = 10_000
SERVER_KEEPALIVE_TIME_MS = 30_000
SERVER_KEEPALIVE_TIMEOUT_MS = 20_000
SERVER_KEEPALIVE_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_ping_strikes", 3),
    ("grpc.http2.max_pings_without_data", 0),
)

#: The largest ProduceRecords request a node reads (RecordService; strom.storage.records_api
#: says why). Here so that the security rules, which run before the handler, know it too.
MAX_PRODUCE_RECORDS_REQUEST_BYTES = 64 << 20
