"""The watch's own stream handling with fake streams: whatever a stream does, the watch's
thread lives on and makes the stream again (the real-etcd cases are in
tests/integration/test_metadata_watch.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from etcd3.etcdrpc import kv_pb2, rpc_pb2

from strom.devcluster.procs import wait_for
from strom.metadata import store as store_module
from strom.metadata.store import EtcdOutage, MetadataStore, Watch, WatchEvent


class _Stream:
    """Stands for _WatchStream: ``responses`` as given."""

    def __init__(self, responses: Iterator[Any]) -> None:
        self.responses = responses

    def close(self) -> None:
        pass


def _created(revision: int) -> Any:
    resp = rpc_pb2.WatchResponse(created=True)
    resp.header.revision = revision
    return resp


def _put(key: str, revision: int) -> Any:
    resp = rpc_pb2.WatchResponse()
    resp.header.revision = revision
    resp.events.append(
        kv_pb2.Event(
            type=kv_pb2.Event.PUT, kv=kv_pb2.KeyValue(key=key.encode(), mod_revision=revision)
        )
    )
    return resp


def _failing(first: Any) -> Iterator[Any]:
    yield first
    raise RuntimeError("a stream that fails in an unforeseen way")


class _Store:
    _closed = False
    timeout = 5.0
    client = None
    _call = MetadataStore._call  # client errors become MetadataUnavailableError
    outage = EtcdOutage([("fake", 0)])


def test_the_watch_thread_outlives_a_stream_that_ends_or_fails_unexpectedly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    streams = [
        _Stream(iter([])),  # ended before etcd's first answer
        _Stream(_failing(_created(1))),  # failed after it
        _Stream(iter([_created(1), _put("/k", 2)])),
    ]
    made: list[Any] = []

    def open_stream(client: Any, request: Any) -> _Stream:
        made.append(request)
        return streams.pop(0) if streams else _Stream(iter([_created(2)]))

    monkeypatch.setattr(store_module, "_WatchStream", open_stream)
    seen: list[WatchEvent] = []
    got = threading.Event()

    def on_events(evs: list[WatchEvent], rev: int) -> None:
        seen.extend(evs)
        got.set()

    watch = Watch(_Store(), "/", 2, on_events, None)  # type: ignore[arg-type]
    try:
        wait_for(got.is_set, timeout=10, what="the event after the failed streams")
    finally:
        watch.cancel()
    assert [e.key for e in seen] == ["/k"]
    assert len(made) >= 3
