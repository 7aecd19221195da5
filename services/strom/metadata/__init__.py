"""Cluster metadata in etcd (DESIGN §3): the one place that talks to the etcd client."""

from strom.metadata.keys import Keys
from strom.metadata.store import (
    Election,
    EtcdNoSpaceError,
    KeepAlive,
    LeaseLostError,
    MetadataStore,
    MetadataUnavailableError,
    Versioned,
    WatchEvent,
    decode,
    encode,
    parse_endpoints,
)
from strom.metadata.view import RESYNC, ClusterView, changed_topics

__all__ = [
    "RESYNC",
    "ClusterView",
    "Election",
    "EtcdNoSpaceError",
    "KeepAlive",
    "Keys",
    "LeaseLostError",
    "MetadataStore",
    "MetadataUnavailableError",
    "Versioned",
    "WatchEvent",
    "changed_topics",
    "decode",
    "encode",
    "parse_endpoints",
]
