"""strom clients. ``ClusterClient`` is the low-level, synchronous RPC layer (bootstrap,
metadata, controller redirects) that the CLI and the higher-level clients build on."""

from strom.client.cluster import ClusterClient, parse_bootstrap

__all__ = ["ClusterClient", "parse_bootstrap"]
