"""A coordinator answering RPCs before its start() finished (found by the chaos suite, issue
13): the gRPC port is bound before etcd is reached, and clients calling in that moment got
UNKNOWN_SERVER_ERROR ("AssertionError") back — not retriable, so a consumer's commit or a
heartbeat failed for good. Every RPC must answer a retriable "not available" instead."""

from __future__ import annotations

import asyncio
from typing import Any

from google.protobuf import message_factory
from google.protobuf.message import Message

from strom.api import coordinator_pb2
from strom.coordinator.service import CoordinatorService
from strom.errors import ErrorCode as E


class _Context:
    def invocation_metadata(self) -> tuple:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted with {code}: {details}")


def _codes(msg: Message) -> list[int]:
    out = []
    for field, value in msg.ListFields():
        if field.name == "error_code":
            out.append(value)
        elif field.message_type is not None:
            items = value if field.is_repeated else [value]
            for item in items:
                if isinstance(item, Message):
                    out.extend(_codes(item))
    return out


def _request(method: Any) -> Message:
    req = message_factory.GetMessageClass(method.input_type)()
    for name in ("group_id", "transactional_id"):
        if name in req.DESCRIPTOR.fields_by_name:
            setattr(req, name, "g")
    if "transaction_timeout_ms" in req.DESCRIPTOR.fields_by_name:
        req.transaction_timeout_ms = 60_000
    if "keys" in req.DESCRIPTOR.fields_by_name:
        req.keys.append("g")
    if "group_ids" in req.DESCRIPTOR.fields_by_name:
        req.group_ids.append("g")
    return req


def test_every_rpc_of_a_starting_coordinator_answers_retriably() -> None:
    svc = CoordinatorService(
        etcd="127.0.0.1:1", cluster="c", coordinator_id=0, advertise_host="h", advertise_port=1
    )
    assert svc.view is None  # start() never ran
    desc = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"]

    async def main() -> dict[str, list[int]]:
        got = {}
        for method in desc.methods:
            resp = await asyncio.wait_for(
                getattr(svc, method.name)(_request(method), _Context()), timeout=10
            )
            got[method.name] = _codes(resp)
        return got

    got = asyncio.run(main())
    unknown = {name: codes for name, codes in got.items() if E.UNKNOWN_SERVER_ERROR in codes}
    assert not unknown, unknown
    for name in ("ConsumerGroupHeartbeat", "OffsetCommit", "OffsetFetch", "InitProducerId"):
        assert E.COORDINATOR_NOT_AVAILABLE in got[name], (name, got[name])
