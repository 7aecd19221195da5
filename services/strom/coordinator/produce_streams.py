"""The coordinator's appends on long-lived ``ProduceStream`` calls, one per storage node.

Why: every offset commit and group change is an acks=all append to a ``__consumer_offsets``
(or ``__transaction_state``) partition before its RPC is answered, so the append's round
trip is part of every synchronous commit. A unary ``Produce`` from grpc.aio pays a call's
set-up on both sides (the coordinator's client call object, headers, status; the node's
handler); a message on an open stream does not. Measured on a 2-core VM (one small batch,
acks=-1, 1,500 sequential appends from grpc.aio each way, alternating): unary p50
1.38 ms, on a stream 0.79 to 0.86 ms (docs/benchmarks.md, "Where a synchronous commit's time
goes").

The stream's rules are the node's (storage.proto, :mod:`strom.storage.stream_rpcs`): requests
are started in arrival order and answered in that order, so an answer is matched to its
request by position; a request refused as a whole ends the stream with its status after the
answers before it. What this module keeps true:

- A request's waiter and the request are queued in one step and one task writes the
  requests in that order, so the waiters are in the stream's order whoever appends.
- When a stream ends or breaks, every request still unanswered fails with a retriable
  :class:`StromError` naming the status; the caller (``StorageIO._produce``) resends the same
  bytes, which the idempotent producer makes safe, exactly as after a failed unary call. The
  next append opens a new stream.
- A request not answered within its timeout cancels the stream (its answers are positional:
  one lost answer makes every later match wrong) and fails like a broken stream.
- So does a request unanswered while its partition's leader moved (the overdue rule, design
  §8): ``moved()`` is asked :data:`OVERDUE_GRACE_S` after it was sent, then every
  :data:`OVERDUE_RECHECK_S`, with one timer handle per request, cancelled with its answer:
  an append to a hung leader need not wait its whole timeout once the partition moved.
- A node that does not know the method (UNIMPLEMENTED: an older version during a rolling
  upgrade) gets unary calls from then on.
- A channel replaced by the channel cache (new credentials) gets a new stream.

The price: answers come in order, so an append waiting for slow followers holds the answers
of the appends of other shards behind it on the same node (at most until its timeout), as
a producer's requests on its streams do. The shards' appends are small and acks=all on the
same followers, so they would mostly wait for the same thing anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc

from strom.api import storage_pb2
from strom.client.sender import OVERDUE_GRACE_S, OVERDUE_RECHECK_S
from strom.errors import StromError

log = logging.getLogger("strom.coordinator")

PRODUCE_STREAM_METHOD = "/strom.v1.StorageService/ProduceStream"


class _Stream:
    """One open ProduceStream call and the waiters of its unanswered requests, in order."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
        self.channel = channel
        method = channel.stream_stream(
            PRODUCE_STREAM_METHOD,
            request_serializer=storage_pb2.ProduceRequest.SerializeToString,
            response_deserializer=storage_pb2.ProduceResponse.FromString,
        )
        self.call: Any = method(metadata=metadata)
        self.waiting: deque[asyncio.Future[storage_pb2.ProduceResponse]] = deque()
        #: Requests to write, in the order of ``waiting``; one task writes them.
        self.outbox: asyncio.Queue[storage_pb2.ProduceRequest] = asyncio.Queue()
        #: Why the stream ended (None while open).
        self.ended: StromError | None = None
        self.unimplemented = False
        self.reader = asyncio.ensure_future(self._read())
        self.writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        """Write the outbox in order. A task of its own: a write can wait for ever on a call
        cancelled before it started (grpc.aio waits for initial metadata that never goes),
        and no append may wait with it; ending the stream cancels this task."""
        try:
            while True:
                request = await self.outbox.get()
                await self.call.write(request)
        except asyncio.CancelledError:
            return
        except Exception as exc:
            # Usually the call has ended (the node refused it, say UNIMPLEMENTED) and the
            # reader has not yet seen why: the call's status says more than the write.
            status = f"write failed: {exc}"
            with contextlib.suppress(Exception):
                code = await asyncio.wait_for(self.call.code(), 1.0)
                self.unimplemented = code == grpc.StatusCode.UNIMPLEMENTED
                status = f"{code.name}: {await self.call.details()}"
            self._end(status)

    async def _read(self) -> None:
        """Hand each answer to the oldest waiter; fail the rest when the stream ends."""
        status = "the node ended the stream"
        try:
            while True:
                answer = await self.call.read()
                if answer is grpc.aio.EOF:
                    break
                if not self.waiting:
                    status = "the node answered a request that was not sent"
                    break
                fut = self.waiting.popleft()
                if not fut.done():
                    fut.set_result(answer)
        except asyncio.CancelledError:
            status = "the stream was closed"
        except grpc.aio.AioRpcError as exc:
            self.unimplemented = exc.code() == grpc.StatusCode.UNIMPLEMENTED
            status = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # a transport failure the call did not wrap
            status = f"the stream broke: {exc}"
        self._end(status)

    def _end(self, status: str) -> None:
        if self.ended is None:
            self.ended = StromError(f"append stream ended ({status})", retriable=True)
        self.call.cancel()
        self.writer.cancel()
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(StromError(self.ended.message, retriable=True))
                fut.exception()  # retrieved: a waiter that gave up is not an unhandled error

    async def send(
        self,
        request: storage_pb2.ProduceRequest,
        timeout_s: float,
        moved: Callable[[], str | None] | None = None,
    ) -> storage_pb2.ProduceResponse:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[storage_pb2.ProduceResponse] = loop.create_future()
        if self.ended is not None:
            raise StromError(self.ended.message, retriable=True)
        # Queued together, so the waiters are in the order the requests go on the wire.
        self.waiting.append(fut)
        self.outbox.put_nowait(request)
        handle: asyncio.TimerHandle | None = None

        def overdue() -> None:
            # Unanswered past the grace: has the partition's leader moved meanwhile?
            nonlocal handle
            handle = None
            if fut.done() or self.ended is not None:
                return
            why = moved() if moved is not None else None
            if why is None:
                handle = loop.call_later(OVERDUE_RECHECK_S, overdue)
                return
            # Answers are matched by position: giving one up ends the stream, as a timeout.
            log.info("no append answer, and %s: resending to the new leader", why)
            self._end(f"no answer, and {why}")

        if moved is not None:
            handle = loop.call_later(OVERDUE_GRACE_S, overdue)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            # Answers are matched by position: one missing makes the rest unusable.
            self._end(f"no answer within {timeout_s:.1f} s")
            raise StromError(
                f"append not answered within {timeout_s:.1f} s", retriable=True
            ) from None
        finally:
            if handle is not None:
                handle.cancel()

    async def close(self) -> None:
        self.reader.cancel()
        self.writer.cancel()
        for task in (self.reader, self.writer):
            with contextlib.suppress(asyncio.CancelledError):
                await task


class ProduceStreams:
    """The coordinator's ProduceStream per storage node address (see the module docstring).

    ``channel_of(address)`` gives the channel to use now (the service's channel cache);
    ``metadata`` goes with every stream (the internal-writer header)."""

    def __init__(
        self,
        channel_of: Callable[[str], grpc.aio.Channel],
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._channel_of = channel_of
        self._metadata = metadata
        self._streams: dict[str, _Stream] = {}
        #: Nodes without ProduceStream (older versions): unary calls.
        self.unary_only: set[str] = set()

    def supported(self, address: str) -> bool:
        """False for a node that answered UNIMPLEMENTED: use the unary call."""
        return address not in self.unary_only

    async def produce(
        self,
        address: str,
        request: storage_pb2.ProduceRequest,
        timeout_s: float,
        moved: Callable[[], str | None] | None = None,
    ) -> storage_pb2.ProduceResponse:
        """Send ``request`` on ``address``'s stream and return its answer.

        Raises a retriable StromError if the stream ends or breaks first, no answer comes
        within ``timeout_s``, or ``moved()`` (asked while the request is overdue, see the
        module docstring) says why its leader is another now (the request may or may not
        have been applied)."""
        stream = self._stream(address)
        try:
            return await stream.send(request, timeout_s, moved)
        except StromError:
            if stream.unimplemented and address not in self.unary_only:
                log.info("node %s has no ProduceStream (an older version): unary calls", address)
                self.unary_only.add(address)
            raise

    def _stream(self, address: str) -> _Stream:
        channel = self._channel_of(address)
        stream = self._streams.get(address)
        if stream is not None and stream.ended is None and stream.channel is channel:
            return stream
        if stream is not None:
            stream._end("replaced")
            stream.reader.cancel()
        stream = _Stream(channel, self._metadata)
        self._streams[address] = stream
        return stream

    async def close(self) -> None:
        """End every stream (their unanswered requests fail)."""
        streams, self._streams = list(self._streams.values()), {}
        for s in streams:
            s._end("the coordinator stops")
            await s.close()
