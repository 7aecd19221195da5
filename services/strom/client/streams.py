"""Produce and Fetch on long-lived bidirectional streams (``ProduceStream``, ``FetchStream``).

Why: a unary gRPC call costs the node about twice the CPU of a message on an open stream, and
adds a call set-up to every round trip (docs/benchmarks.md, "Produce and Fetch on streams").
The node answers a stream's requests in the order they were sent (storage.proto), so a
client matches each answer to its request by position, with no id on the wire.

- :class:`RequestStream`: many requests in flight (the producer pipelines up to
  ``max_in_flight`` per node). One thread per stream reads the answers and hands each to the
  callback given with its request.
- :class:`FetchStreams`: a pool of streams per node, each used for one request at a time by
  whichever thread fetches (a consumer has at most a few fetches in flight per node).

A request's deadline (the unary call's ``timeout``) is kept by one watchdog thread for all
streams of the process: a stream whose oldest unanswered request is past its deadline is
cancelled, and its requests fail with DEADLINE_EXCEEDED, as a unary call's would.

When a stream ends, the first unanswered request gets the stream's status (a refused request
ends the stream with its status, after the answers before it) and the ones after it get
UNAVAILABLE: the node read none of them after a refusal, and after a transport failure they
are in doubt exactly as a failed unary call is. A node that does not know the streams (an
older version, during a rolling upgrade) answers UNIMPLEMENTED: callers then use the unary
calls for that node (:attr:`Unsupported`).
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import grpc

PRODUCE_STREAM_METHOD = "/strom.v1.StorageService/ProduceStream"
FETCH_STREAM_METHOD = "/strom.v1.StorageService/FetchStream"

_END = object()


#: Statuses a node ends a stream with for a request it refused as a whole, or for a method
#: it does not know: it read no request after that one (storage.proto).
_REFUSALS = frozenset(
    {
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


class StreamError(grpc.RpcError):
    """A request's failure on a stream, shaped like a unary call's ``grpc.RpcError``.

    ``unsent``: the node certainly did not apply the request (it does not know the stream's
    method, or it refused a request before this one and read nothing after it), so it may be
    sent again as it is."""

    def __init__(self, code: grpc.StatusCode, details: str, unsent: bool = False) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self.unsent = unsent

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _status(exc: BaseException | None) -> StreamError:
    """The stream's end as a StreamError (a status, else UNAVAILABLE)."""
    if isinstance(exc, StreamError):
        return exc
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        code = exc.code()
        details = exc.details() if hasattr(exc, "details") else ""
        if isinstance(code, grpc.StatusCode):
            return StreamError(code, details or "")
    return StreamError(grpc.StatusCode.UNAVAILABLE, f"the stream ended: {exc or 'no answer'}")


class _Watchdog:
    """Cancels streams whose oldest unanswered request is past its deadline."""

    PERIOD_S = 0.25

    def __init__(self) -> None:
        self._streams: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, stream: Any) -> None:
        with self._lock:
            self._streams.add(stream)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="strom-stream-watchdog", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.PERIOD_S)
            if not self._check(time.monotonic()):
                return

    def _check(self, now: float) -> bool:
        """One look (a call of its own, so that no stream is kept alive by the loop's
        frame while it sleeps): cancel the late streams, stop watching the ended ones, and
        False, with the thread forgotten, when none is left. The thread ends then and the
        next ``watch`` starts another, rather than outliving every client."""
        with self._lock:
            streams = list(self._streams)
        ended = [s for s in streams if not s.check_deadline(now)]
        with self._lock:
            for s in ended:
                self._streams.discard(s)
            if not self._streams:
                self._thread = None
                return False
        return True


_WATCHDOG = _Watchdog()


class _Requests:
    """The request side of one call: an iterator gRPC's own thread pulls from."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, request: Any) -> None:
        self._q.put(request)

    def end(self) -> None:
        self._q.put(_END)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._q.get, _END)


class RequestStream:
    """One ProduceStream to a node, with many requests in flight (see the module docstring).

    ``send`` never blocks; the answer (or the request's failure) goes to its callback, on the
    stream's reader thread, as an object whose ``result()`` returns the answer or raises a
    ``grpc.RpcError``, like a unary call's future.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        method: str,
        deserializer: Callable[[bytes], Any],
        metadata: Any,
        name: str,
    ) -> None:
        self._requests = _Requests()
        #: (deadline, callback) of each unanswered request, oldest first.
        self._waiting: deque[tuple[float, Callable[[Any], None]]] = deque()
        self._lock = threading.Lock()
        self.closed = False
        #: The status the stream ended with (None while open, or after a clean end).
        self.ended_with: grpc.StatusCode | None = None
        self._expired = False
        #: Set once the node answered the call's headers (it knows the method) or the call
        #: ended: a node of an older version answers UNIMPLEMENTED before any request is
        #: sent, like Kafka's ApiVersions hand-shake (see :meth:`wait_ready`).
        self._ready = threading.Event()
        self._call = channel.stream_stream(
            method, request_serializer=None, response_deserializer=deserializer
        )(iter(self._requests), metadata=metadata)
        threading.Thread(target=self._read, name=name, daemon=True).start()
        _WATCHDOG.watch(self)

    def wait_ready(self, timeout_s: float) -> grpc.StatusCode | None:
        """Wait (up to ``timeout_s``) for the node's headers; the status the stream already
        ended with, if it did (UNIMPLEMENTED: the node has no such stream)."""
        self._ready.wait(timeout_s)
        with self._lock:
            return self.ended_with

    def send(self, request: bytes, timeout_s: float, done: Callable[[Any], None]) -> bool:
        """Queue ``request``; False when the stream has ended (open another)."""
        with self._lock:
            if self.closed:
                return False
            self._waiting.append((time.monotonic() + timeout_s, done))
            self._requests.put(request)
        return True

    def check_deadline(self, now: float) -> bool:
        """Cancel the call when its oldest request is late; whether it still needs watching
        (a closed stream is never cancelled for lateness)."""
        with self._lock:
            closed = self.closed
            late = not closed and bool(self._waiting) and self._waiting[0][0] < now
            if late:
                self._expired = True
        if late:
            self._call.cancel()
        return not closed

    def close(self) -> None:
        """Half-close: the node answers what it has, then the stream ends."""
        with self._lock:
            self.closed = True
            self._requests.end()

    def cancel(self) -> None:
        self.close()
        self._call.cancel()

    def _read(self) -> None:
        error: BaseException | None = None
        try:
            self._call.initial_metadata()  # returns when the headers came or the call ended
            self._ready.set()
            for answer in self._call:
                with self._lock:
                    _, done = self._waiting.popleft()
                done(_Answer(answer, None))
        except grpc.RpcError as exc:
            error = exc
        except Exception as exc:  # an answer that does not parse
            error = StreamError(grpc.StatusCode.INTERNAL, f"bad answer: {exc}")
        with self._lock:
            if self._expired:
                first = StreamError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "no answer within the timeout"
                )
            else:
                first = _status(error)
            if error is not None:
                self.ended_with = first.code()
            self.closed = True
            self._requests.end()  # frees gRPC's thread pulling the requests
            waiting = list(self._waiting)
            self._waiting.clear()
        self._ready.set()
        if first.code() == grpc.StatusCode.UNIMPLEMENTED:
            first.unsent = True
        rest = StreamError(
            grpc.StatusCode.UNAVAILABLE,
            f"not answered: the stream ended before ({first.code().name})",
            unsent=first.code() in _REFUSALS,
        )
        for i, (_, done) in enumerate(waiting):
            done(_Answer(None, first if i == 0 else rest))
        if error is not None:
            # The call raised itself (a gRPC rendezvous is its own exception): its traceback
            # holds this frame, whose locals hold the requests' ``done`` callbacks and so
            # their client, and gRPC's C layer keeps the call alive where the cycle collector
            # cannot see it: every closed Producer (its buffers too) would stay in memory.
            error.__traceback__ = None


class _Answer:
    """A request's outcome, read like a finished unary future."""

    __slots__ = ("_error", "_value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self._value = value
        self._error = error

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class _PingPong:
    """One FetchStream used for one request at a time."""

    def __init__(self, channel: grpc.Channel, method: str, serializer: Any, metadata: Any) -> None:
        self._requests = _Requests()
        self._deadline: float | None = None
        self._expired = False
        self.broken = False
        self._call = channel.stream_stream(method, request_serializer=serializer)(
            iter(self._requests), metadata=metadata
        )
        _WATCHDOG.watch(self)

    def ask(self, request: Any, timeout_s: float) -> Any:
        self._requests.put(request)
        return self.answer(timeout_s)

    def answer(self, timeout_s: float) -> Any:
        """The next answer on the stream, within ``timeout_s`` (else the stream is cancelled
        and DEADLINE_EXCEEDED raised)."""
        self._deadline = time.monotonic() + timeout_s
        try:
            return next(self._call)
        except StopIteration:
            self._break()
            raise StreamError(grpc.StatusCode.UNAVAILABLE, "the stream ended") from None
        except grpc.RpcError as exc:
            # The call raised itself (a rendezvous is its own exception): its traceback holds
            # frames that hold the call, a cycle only the cycle collector frees, maybe only at
            # interpreter shutdown, where the call's __del__ takes a lock a frozen daemon thread may
            # hold, and the process would never exit. Without the traceback the call goes as soon as
            # it is let go.
            exc.__traceback__ = None
            self._break()
            if self._expired:
                raise StreamError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "no answer within the timeout"
                ) from None
            raise _status(exc) from None
        finally:
            self._deadline = None

    def usable(self) -> bool:
        """Whether the stream is still open (it may end while idle: a node stopping)."""
        return not self.broken and not self._call.done()

    def check_deadline(self, now: float) -> bool:
        """Cancel the call when its answer is late; whether it still needs watching."""
        deadline = self._deadline
        if deadline is not None and deadline < now and not self.broken:
            self._expired = True
            self._call.cancel()
        return not self.broken

    def _break(self) -> None:
        self.broken = True
        self._requests.end()

    def close(self) -> None:
        self._break()
        self._call.cancel()


class FollowStream(_PingPong):
    """A FetchStream carrying one followed request (storage.proto, ``FetchRequest.follow``):
    the node answers it, then goes on answering from where each answer ended, and each
    :meth:`answer` takes the next of those. Read by one thread at a time; closing it (a
    cancel) is the only way to end the follow early."""

    def __init__(
        self,
        channel: grpc.Channel,
        serializer: Any,
        metadata: Any,
        request: Any,
        wait_s: float,
    ) -> None:
        super().__init__(channel, FETCH_STREAM_METHOD, serializer, metadata)
        self._requests.put(request)
        #: The request's long-poll wait: the node's next answer comes at most this long
        #: after the last one (plus the trip), data or not.
        self.wait_s = wait_s
        self.last_answer = time.monotonic()

    def answer(self, timeout_s: float) -> Any:
        try:
            return super().answer(timeout_s)
        finally:
            self.last_answer = time.monotonic()

    def grant(self, request: Any) -> None:
        """Send ``request`` on the stream: during a follow, a grant of more answers."""
        self._requests.put(request)

    def header(self, name: str) -> str | None:
        """A header the node sent with the call (call it once an answer came: the headers
        came first, so this does not wait)."""
        try:
            for key, value in self._call.initial_metadata() or ():
                if key == name:
                    return str(value)
        except grpc.RpcError:
            pass
        return None


class FetchStreams:
    """FetchStreams per node, lent to one fetching thread at a time."""

    def __init__(self, serializer: Callable[[Any], bytes], metadata: Any) -> None:
        self._serializer = serializer
        self._metadata = metadata
        self._lock = threading.Lock()
        self._idle: dict[str, list[_PingPong]] = {}
        self._all: set[_PingPong] = set()
        self._closed = False

    def ask(
        self,
        channel: grpc.Channel,
        address: str,
        request: Any,
        timeout_s: float,
        watcher: Any = None,
    ) -> Any:
        """Send ``request`` to the node at ``address`` on a free stream; its answer bytes.
        Raises ``grpc.RpcError`` as a unary call would. ``watcher``: an object whose
        ``cancel`` attribute holds the stream's cancel while the request waits (None again
        before the stream goes back to the pool), so that another thread can give the request
        up (the consumer's fetcher does, for a request to a node that hung)."""
        with self._lock:
            if self._closed:
                raise ValueError("the consumer is closed")
            idle = self._idle.get(address, [])
            stream = None
            ended: list[_PingPong] = []
            while idle and stream is None:
                candidate = idle.pop()
                if candidate.usable():
                    stream = candidate
                else:  # ended while idle (the node stopped or restarted)
                    self._all.discard(candidate)
                    ended.append(candidate)
        for s in ended:
            s.close()
        if stream is None:
            stream = _PingPong(channel, FETCH_STREAM_METHOD, self._serializer, self._metadata)
            with self._lock:
                self._all.add(stream)
        answered = False
        if watcher is not None:
            watcher.cancel = stream.close
        try:
            answer = stream.ask(request, timeout_s)
            answered = True
            return answer
        finally:
            if watcher is not None:
                watcher.cancel = None
            with self._lock:
                # A stream left with a request unanswered (an exception such as
                # KeyboardInterrupt while waiting) would hand its answer to the next caller.
                if not answered or stream.broken or self._closed:
                    self._all.discard(stream)
                    stream.close()
                else:
                    self._idle.setdefault(address, []).append(stream)

    def forget(self, address: str) -> None:
        """Close the idle streams to ``address`` (its channel is going away)."""
        with self._lock:
            streams = self._idle.pop(address, [])
            for s in streams:
                self._all.discard(s)
        for s in streams:
            s.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            streams = list(self._all)
            self._all.clear()
            self._idle.clear()
        for s in streams:
            s.close()
