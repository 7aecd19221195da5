"""Every channel strom makes looks its target's DNS name up again within a second (gRPC's
default waits 30 s between look-ups, so a peer restarted under its name at a new IP, a
Kubernetes pod, was dialled at its dead old IP for up to 30 s; found from outside).
tests/integration/test_dns_move.py shows the effect with real processes; this checks that
each kind of channel carries the option."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import grpc

from strom.client.cluster import ClusterClient
from strom.grpc_options import DNS_MIN_RESOLUTION_INTERVAL_MS, GRPC_OPTIONS
from strom.metadata.store import CHANNEL_OPTIONS
from strom.security.channel import ChannelSecurity
from strom.storage.replica_fetchers import FOLLOWER_OPTIONS

OPTION = "grpc.dns_min_time_between_resolutions_ms"
SERVICES = Path(__file__).resolve().parents[2] / "services" / "strom"


def test_the_re_resolution_floor_is_a_second_or_so() -> None:
    assert 0 < DNS_MIN_RESOLUTION_INTERVAL_MS <= 1000


def test_services_and_etcd_channels_carry_it() -> None:
    for options in (GRPC_OPTIONS, FOLLOWER_OPTIONS, CHANNEL_OPTIONS):
        assert dict(options)[OPTION] == DNS_MIN_RESOLUTION_INTERVAL_MS


def test_every_channel_cache_of_the_services_is_made_with_grpc_options() -> None:
    """The coordinator's, the RecordService forwarding's and the nodes' controller client's
    caches (channels kept for the process's life: the ones that stayed on an old IP)."""
    calls = []
    for path in SERVICES.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "ChannelCache"
            ):
                calls.append((path.relative_to(SERVICES), ast.unparse(node)))
    assert len(calls) >= 3, calls
    # GRPC_OPTIONS, or GRPC_OPTIONS and more.
    assert all(
        call == "ChannelCache(GRPC_OPTIONS)" or call.startswith("ChannelCache([*GRPC_OPTIONS, ")
        for _, call in calls
    ), calls


def test_the_python_clients_channels_carry_it(monkeypatch: Any) -> None:
    seen: list[dict[str, Any]] = []
    real = ChannelSecurity.channel

    def channel(self: ChannelSecurity, address: str, options: Any = ()) -> grpc.Channel:
        seen.append(dict(options))
        return real(self, address, options)

    monkeypatch.setattr(ChannelSecurity, "channel", channel)
    with ClusterClient("127.0.0.1:1", retry_s=0, client_id="app") as client:
        client.channel("strom-0.strom-storage-headless:9092")
    assert seen and seen[0][OPTION] == DNS_MIN_RESOLUTION_INTERVAL_MS
