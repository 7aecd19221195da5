"""ProduceStream and FetchStream: Produce and Fetch on long-lived bidirectional streams.

Why: on this stack most of a node's CPU for a small Produce or Fetch is gRPC's per-call work
(set-up, metadata, status), not strom's. A message on an open stream costs the node about half
of a unary call (docs/benchmarks.md, "Produce and Fetch on streams"), and a producer or
consumer at 10,000 records/s makes a few thousand such requests a second.

The rules (storage.proto): requests are started in arrival order and answered in that order,
one answer each, so a client matches answers to requests by position. Produce requests are
pipelined: each is started as soon as it is read (its appends are queued behind the
previous request's, so they keep the stream's order), and up to :data:`PIPELINE` wait for
their answers at once; Fetch requests are served one after another (a consumer has one in
flight per stream). A request refused as a whole ends the stream with that status after the
answers of the requests before it, and nothing after it is read:

- authorization: :mod:`strom.security.interceptor` checks each request and ends the request
  stream the handler sees at the first refused one (PERMISSION_DENIED);
- load shedding: a Produce the node's admission refuses (RESOURCE_EXHAUSTED), as the unary
  call is refused.

Every request is timed under its unary name (``strom_storage_request_latency_seconds{rpc=
"Produce"}`` ...), so the dashboards and alerts see one kind of request either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from strom.api import storage_pb2
from strom.security.interceptor import STREAM_REQUEST_DENIED
from strom.security.rules import is_fetch_grant
from strom.storage import metrics
from strom.storage.fetch_rpcs import FollowerSession, FollowStep
from strom.storage.replica_claims import is_follower_fetch
from strom.storage.rpc_base import StorageCore, _owing_principal, _timed
from strom.storage.wire import ProduceRequestView

pb = storage_pb2

#: Produce requests of one stream started and not yet answered, at most; past it the node
#: stops reading the stream (HTTP/2 flow control then holds the client back).
PIPELINE = 32
#: Sent with every FetchStream's headers: this node follows requests (FetchRequest.follow).
FOLLOW_HEADER = "strom-fetch-follow"
#: The shortest long poll of a followed request's continuations (storage.proto).
FOLLOW_MIN_WAIT_MS = 20


class StreamRpcs(StorageCore):
    """The two stream handlers, mixed into :class:`~strom.storage.servicer.StorageServicer`."""

    #: Tasks of open streams waiting for their next request (ended by :meth:`end_streams`).
    stream_readers: set[asyncio.Task[Any]]

    if TYPE_CHECKING:  # provided by the servicer and by FetchRpcs

        async def _produce(self, request: Any, context: Any) -> pb.ProduceResponse: ...

        async def fetch_raw(self, request: pb.FetchRequest, context: Any) -> bytes: ...

        async def fetch_followed(self, step: FollowStep, context: Any) -> bytes: ...

    def _release(self, admitted: int, owing: str | None, _task: object) -> None:
        if self.admission is not None:
            self.admission.release(admitted, owing)

    @_timed("Produce")
    async def _produce_streamed(self, request: Any, context: Any) -> pb.ProduceResponse:
        return await self._produce(request, context)

    def end_streams(self) -> None:
        """Node shutdown: every open stream stops reading requests, answers those it has and
        ends (status OK), so the server's grace period is not spent waiting for clients that
        keep their streams open. Called after ``shutting_down`` is set."""
        for reading in list(self.stream_readers):
            reading.cancel()

    async def _next_request(self, requests: AsyncIterator[Any]) -> Any | None:
        """The stream's next request; None at its end, or when the node is shutting down."""
        if self.shutting_down:
            return None
        task = asyncio.current_task()
        assert task is not None
        waiting = self.stream_readers
        waiting.add(task)
        try:
            return await anext(requests)
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if self.shutting_down:  # end_streams(): end this stream cleanly
                task.uncancel()
                return None
            raise
        finally:
            waiting.discard(task)

    async def produce_stream(
        self, requests: AsyncIterator[storage_pb2.ProduceRequest | ProduceRequestView], context: Any
    ) -> AsyncIterator[pb.ProduceResponse]:
        """Answers a stream of Produce requests in order (see the module docstring)."""
        started: asyncio.Queue[asyncio.Future[pb.ProduceResponse] | str | None] = asyncio.Queue(
            PIPELINE
        )
        failed: list[BaseException] = []
        requests = aiter(requests)

        async def read() -> None:
            end: str | None = None
            try:
                while (request := await self._next_request(requests)) is not None:
                    admitted = 0
                    owing = None
                    if self.admission is not None:
                        t0 = time.perf_counter()
                        admitted = sum(
                            len(pd.records) for td in request.topics for pd in td.partitions
                        )
                        owing = _owing_principal("produce")
                        refusal = self.admission.try_admit(admitted, owing)
                        if refusal is not None:
                            metrics.PRODUCE_SHED.inc()
                            # Timed as the unary call's refusal is (a
                            # shed request on a stream was in no latency series).
                            metrics.REQUEST_LATENCY.labels("Produce", "RESOURCE_EXHAUSTED").observe(
                                time.perf_counter() - t0
                            )
                            end = refusal
                            break
                    task = asyncio.ensure_future(self._produce_streamed(request, context))
                    if admitted:
                        task.add_done_callback(functools.partial(self._release, admitted, owing))
                    await started.put(task)
            except Exception as exc:  # the stream broke, or a request did not parse
                failed.append(exc)
            await started.put(end)  # (not reached when cancelled: nobody reads it then)

        # Headers at once: the client waits for them before its first request (a node
        # without this method answers UNIMPLEMENTED instead, and the client uses unary calls).
        await context.send_initial_metadata(())
        reader = asyncio.ensure_future(read())
        metrics.OPEN_STREAMS.labels("ProduceStream").inc()
        try:
            while True:
                item = await started.get()
                if item is None:
                    break
                if isinstance(item, str):
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, item)
                answer = await item
                # One pass of the loop before the answer goes out: the fetches this append
                # woke (a caught-up consumer's long poll or follow) answer first. Sending
                # the answer costs the loop ~0.1 ms of gRPC, and the consumer's answer is
                # what every record of the request waits for; the producer then finds a
                # little more to send in its next request (docs/benchmarks.md, "The node's
                # side of a record's way").
                await asyncio.sleep(0)
                yield answer
            if failed:
                raise failed[0]
        finally:
            metrics.OPEN_STREAMS.labels("ProduceStream").dec()
            if not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader

    async def fetch_stream(
        self, requests: AsyncIterator[pb.FetchRequest], context: Any
    ) -> AsyncIterator[bytes]:
        """Answers a stream of Fetch requests one after another (long polls, as unary).

        A consumer's request with ``follow`` set is answered again and again, each time from
        where the last answer ended (storage.proto, FetchRequest.follow), until an answer
        has a partition error (then the next request is read) or the call ends. Why: a
        consumer that keeps up otherwise sends a request after every answer, and an append
        that lands while that request is on its way waits for it; followed, the node answers
        the append as it lands and the consumer sends nothing but a grant now and then
        (``follow_answers``: a consumer that falls behind stops granting, and what lands
        meanwhile goes out in one answer instead of many queued small ones). Requests during
        a follow are grants only: the client ends a follow by cancelling the call. The
        node's shutdown wakes the long poll; the stream then ends."""
        # The header tells clients that this node follows (an older one ignores ``follow``).
        await context.send_initial_metadata(((FOLLOW_HEADER, "1"),))
        metrics.OPEN_STREAMS.labels("FetchStream").inc()
        requests = aiter(requests)
        session: FollowerSession | None = None  # a follower's (made at its first request)
        try:
            while (request := await self._next_request(requests)) is not None:
                if is_fetch_grant(request):
                    continue  # for a follow that has ended (on an error): nothing to answer
                if is_follower_fetch(request):
                    if session is None:
                        session = FollowerSession()
                    session.request = request
                    yield await self.fetch_in_session(session, context)
                    continue
                if not request.follow:
                    yield await self.fetch_raw(request, context)
                    continue
                if request.max_wait_ms < FOLLOW_MIN_WAIT_MS:
                    # Every continuation is a long poll of at least this: a follow must not
                    # have the node answer an idle partition in a tight loop.
                    request.max_wait_ms = FOLLOW_MIN_WAIT_MS
                # Answers the client still grants (None: no bound). A grant is read only
                # when none is left: the stream's requests wait in gRPC's buffers till then.
                granted = request.follow_answers if request.follow_answers > 0 else None
                step = FollowStep(request)
                first = True
                while True:
                    if granted is not None:
                        while granted <= 0:
                            grant = await self._next_request(requests)
                            if grant is None:
                                return
                            granted += max(grant.follow_answers, 1)
                        granted -= 1
                    if not first:
                        # Authorized again each time, as a request would be, and after any
                        # wait for a grant: an ACL removed during a follow ends it (as it
                        # refuses the next request).
                        denied = STREAM_REQUEST_DENIED.get()
                        why = denied(step.request) if denied is not None else None
                        if why is not None:
                            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
                        metrics.FETCH_FOLLOWED.inc()
                    first = False
                    yield await self.fetch_followed(step, context)
                    if self.shutting_down:
                        return
                    if not step.advance():
                        break
        finally:
            metrics.OPEN_STREAMS.labels("FetchStream").dec()
