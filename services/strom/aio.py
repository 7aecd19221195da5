"""asyncio versions of :class:`Producer`, :class:`Consumer` and :class:`Admin`.

``from strom.aio import Producer, Consumer, Admin`` gives the same clients with awaitable
methods, for services built on asyncio (aiohttp, FastAPI, grpc.aio …). They wrap the
threaded clients rather than re-implementing them: the real work already happens off the
caller's thread (the producer's sender thread, the consumer's prefetching fetcher), so the
asyncio layer only has to never block the event loop. What may block runs in threads of the
client's own (:class:`_Threads`), never in the loop's default executor: a client waiting
there must not hold up the application's ``asyncio.to_thread`` calls or another client's.

- ``Producer.send`` returns an ``asyncio.Future`` of :class:`RecordMetadata` (await it, or
  ``await producer.send_and_wait(...)``). On the loop it only tries to append (the sync
  producer's ``space_wait_until(NO_WAIT)``); a send that would wait, for metadata or buffer
  space, goes to the producer's one sending thread and waits there until ``max_block_ms``
  after the call, and the sends after it follow it there, in order, until it is done.
- ``Consumer.poll`` / ``poll_arrow`` answer at once from prefetched data when there is some
  and otherwise wait in the consumer's poll thread (cancelled, e.g. by ``asyncio.wait_for``,
  what that thread's poll takes goes back for the next poll); ``async for record in
  consumer`` works, and a loop left early (``break``, an exception, a cancellation) puts
  back the records it did not hand out, as the sync consumer's loop does. Every poll of
  these three kinds starts only once the previous one has settled (its records returned
  or put back): two sync polls never run at once.
- a rebalance listener's methods may be coroutines (see ``Consumer.subscribe``): a poll that
  has partitions to hand over runs in the poll thread, and the listener's coroutines run on
  the loop meanwhile; what they await of the consumer (``commit``, ``committed`` …) runs in
  the consumer's other threads, never behind the poll that waits for them. Such a consumer
  belongs to its loop: polling or closing it from another raises RuntimeError.
- every ``Admin`` method is a coroutine; so are the producer's transaction calls but
  ``begin_transaction``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

from strom.client import admin as _admin
from strom.client import consumer as _consumer
from strom.client import producer as _producer
from strom.client.types import RecordMetadata, TopicPartition
from strom.record import Record

#: The longest sync poll an awaited ``poll``/``poll_arrow`` makes in its worker thread at a
#: time (a longer timeout is several): what a cancelled poll's thread may still take before
#: it stops, and so how long the next poll or ``close()`` waits for it.
POLL_SLICE_MS = 200.0

__all__ = ["Admin", "Consumer", "Producer", "RecordMetadata", "TopicPartition"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _init_as(
    sync_cls: Callable[_P, object],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, _P], None]]:
    """Give a wrapper's ``__init__(self, *args, **kwargs)`` the parameters of ``sync_cls``'s
    constructor: for type checkers (the returned type) and for ``inspect.signature`` and
    IDEs at run time (``functools.wraps``' ``__wrapped__``), so that ``aio.Producer(...)``
    is checked and completed like ``Producer(...)`` without repeating its parameters."""

    def same(init: Callable[..., None]) -> Callable[Concatenate[Any, _P], None]:
        return functools.wraps(cast(Any, sync_cls).__init__)(init)

    return same


class _Threads:
    """Worker threads of one aio client, instead of the event loop's default executor.

    The clients block in these threads (a send waiting for buffer space, a poll waiting for
    a rebalance listener's coroutine); in the default executor they took the application's
    threads, which queued its own ``asyncio.to_thread`` calls and this library's other calls
    behind them (found from outside: eight consumers whose async listeners awaited
    ``consumer.commit()`` deadlocked; waiting sends held up ``admin.list_topics()`` 39 s)."""

    def __init__(self, name: str, workers: int) -> None:
        self._name = name
        self._workers = workers
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(
        self, fn: Callable[..., _R], *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[_R]:
        """Run ``fn`` in one of the threads (with the caller's contextvars, as to_thread)."""
        with self._lock:
            if self._pool is None:  # created on first use: many clients never block
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self._workers, thread_name_prefix=self._name
                )
            pool = self._pool
        ctx = contextvars.copy_context()
        return pool.submit(ctx.run, functools.partial(fn, *args, **kwargs))

    async def run(self, fn: Callable[..., _R], *args: Any, **kwargs: Any) -> _R:
        """``await asyncio.to_thread(fn, ...)``, in these threads."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def shutdown(self) -> None:
        """Let the threads end once idle (the client is closed)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)


#: Threads per client for its calls that do not wait on the event loop (commit, Admin …).
CALL_THREADS = 4


if TYPE_CHECKING:

    def _awaitable(
        fn: Callable[Concatenate[Any, _P], _R],
    ) -> Callable[Concatenate[Any, _P], Coroutine[Any, Any, _R]]:
        """Typing only: a sync method as ``Consumer.__getattr__`` hands it out (a
        coroutine function with the same parameters)."""
        ...

    def _as_is(fn: Callable[Concatenate[Any, _P], _R]) -> Callable[Concatenate[Any, _P], _R]:
        """Typing only: a sync method ``Consumer.__getattr__`` hands out unchanged."""
        ...


class Producer:
    """asyncio face of :class:`strom.client.producer.Producer` (same arguments)."""

    @_init_as(_producer.Producer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync = _producer.Producer(*args, **kwargs)
        #: The one thread in which sends (and ``send_batch``) wait for metadata or buffer
        #: space, in the order they were made; how many are handed to it and not done yet.
        self._lane = _Threads("strom-aio-send", 1)
        self._waiting = 0
        self._calls = _Threads("strom-aio-producer", CALL_THREADS)

    async def send(self, topic: str, value: Any = None, **kwargs: Any) -> asyncio.Future[Any]:
        """Queue one record; returns an asyncio Future of its RecordMetadata.

        The event loop only tries to append (never waits: found from outside, a full buffer
        froze the loop for ``max_block_ms``); a send that would wait, for metadata or for
        buffer space, goes to this producer's one sending thread, as do the sends after it
        until it is done (so records keep their order). It waits there until
        ``max_block_ms`` after this call, then raises the sync send's timeout error."""
        p = self._sync
        end = time.monotonic() + p.max_block_s
        if not self._waiting and topic in p._counts:
            try:
                with _producer.space_wait_until(_producer.NO_WAIT):
                    return asyncio.wrap_future(p.send(topic, value, **kwargs))
            except _producer.WouldBlockError:
                pass  # nothing was queued: wait in the sending thread
        fut = await self._in_lane(p.send, end, topic, value, **kwargs)
        return asyncio.wrap_future(fut)

    async def _in_lane(self, fn: Callable[..., _R], end: float, *args: Any, **kwargs: Any) -> _R:
        """Run ``fn`` in the sending thread, waiting for buffer space until ``end`` at most."""

        def run() -> _R:
            with _producer.space_wait_until(end):
                return fn(*args, **kwargs)

        self._waiting += 1
        try:
            return await self._lane.run(run)
        finally:
            self._waiting -= 1

    async def send_and_wait(self, topic: str, value: Any = None, **kwargs: Any) -> RecordMetadata:
        return await (await self.send(topic, value, **kwargs))

    async def send_batch(self, topic: str, values: Any, *args: Any, **kwargs: Any) -> Any:
        """Queue many records; returns the list of BatchMetadata once all are acknowledged.
        Converted and queued in the sending thread (after the sends made before it)."""
        end = time.monotonic() + self._sync.max_block_s
        fut = await self._in_lane(self._sync.send_batch, end, topic, values, *args, **kwargs)
        return await asyncio.wrap_future(fut)

    async def flush(self, timeout: float | None = None) -> None:
        await self._calls.run(self._sync.flush, timeout)

    async def close(self, timeout: float | None = None) -> None:
        """Close the sync producer. Not in the sending thread: a send waiting there for
        buffer space fails at once when the close begins, as a sync one does."""
        try:
            await self._calls.run(self._sync.close, timeout)
        finally:
            self._lane.shutdown()
            self._calls.shutdown()

    def metrics(self) -> dict[str, float]:
        """The producer's metrics (:meth:`strom.client.producer.Producer.metrics`): a plain
        call, it never waits."""
        return self._sync.metrics()

    async def partitions_for(self, topic: str) -> list[int]:
        return await self._calls.run(self._sync.partitions_for, topic)

    # -- transactions (each call may wait on the coordinator: a worker thread) --------------

    async def init_transactions(self, timeout: float | None = None) -> None:
        await self._calls.run(self._sync.init_transactions, timeout)

    def begin_transaction(self) -> None:
        """Local: never waits. After an abort that got no answer it is refused (call
        ``await abort_transaction()`` again); ``transaction()`` asks again itself."""
        txn = self._sync._require_txn()
        txn.begin(None)
        self._sync._txn_failed = None

    @contextlib.asynccontextmanager
    async def transaction(self, timeout: float | None = None) -> AsyncIterator[Producer]:
        """``async with producer.transaction(): ...``: the sync producer's
        ``transaction()`` (commit at the end, abort when the block raises, a commit that got
        no answer asked again, a block's abort that failed done again first), its
        coordinator calls in a worker thread."""
        await self._lane.run(self._sync._finish_block_abort, timeout)
        await self._calls.run(self._sync.begin_transaction)
        try:
            yield self
        except BaseException:
            await self._lane.run(self._sync._abort_block, timeout)
            raise
        await self._lane.run(self._sync._commit_block, timeout)

    async def prepare_transaction(self, timeout: float | None = None) -> Any:
        """The sync producer's ``prepare_transaction()`` (KIP-939's first phase)."""
        return await self._lane.run(self._sync.prepare_transaction, timeout)

    async def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any) -> None:
        await self._calls.run(self._sync.send_offsets_to_transaction, offsets, group_metadata)

    async def commit_transaction(self, timeout: float | None = None) -> None:
        await self._lane.run(self._sync.commit_transaction, timeout)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        await self._lane.run(self._sync.abort_transaction, timeout)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Consumer:
    """asyncio face of :class:`strom.client.consumer.Consumer` (same arguments)."""

    #: Methods that may wait on the network: coroutines here.
    _BLOCKING = frozenset(
        {
            "commit",
            "committed",
            "beginning_offsets",
            "end_offsets",
            "offsets_for_times",
            "position",
            "seek_to_beginning",
            "seek_to_end",
            "seek_to_committed",
            "topics",
            "partitions_for_topic",
            "subscribe",
            "unsubscribe",
            "assign",
        }
    )

    if TYPE_CHECKING:
        # What __getattr__ hands out, for type checkers and IDEs: the methods that may wait
        # as coroutine functions with the sync ones' parameters, the others as they are.
        _C = _consumer.Consumer
        assign = _awaitable(_C.assign)
        beginning_offsets = _awaitable(_C.beginning_offsets)
        commit = _awaitable(_C.commit)
        committed = _awaitable(_C.committed)
        end_offsets = _awaitable(_C.end_offsets)
        offsets_for_times = _awaitable(_C.offsets_for_times)
        partitions_for_topic = _awaitable(_C.partitions_for_topic)
        position = _awaitable(_C.position)
        seek_to_beginning = _awaitable(_C.seek_to_beginning)
        seek_to_committed = _awaitable(_C.seek_to_committed)
        seek_to_end = _awaitable(_C.seek_to_end)
        topics = _awaitable(_C.topics)
        unsubscribe = _awaitable(_C.unsubscribe)
        assignment = _as_is(_C.assignment)
        closed: bool
        commit_async = _as_is(_C.commit_async)
        group_metadata = _as_is(_C.group_metadata)
        highwater = _as_is(_C.highwater)
        metrics = _as_is(_C.metrics)
        pause = _as_is(_C.pause)
        paused = _as_is(_C.paused)
        resume = _as_is(_C.resume)
        seek = _as_is(_C.seek)
        subscription = _as_is(_C.subscription)

    @_init_as(_consumer.Consumer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync = _consumer.Consumer(*args, **kwargs)
        # Other tasks may commit, read positions, pause and seek while a poll runs in the
        # poll thread; two polls at once cannot happen here (every poll goes through _gated).
        self._sync._shared = True
        #: The one thread for the calls that may run the rebalance listener (polls, subscribe,
        #: unsubscribe, close), which may wait there for its coroutines on the event loop;
        #: the listener's own awaits (commit, committed …) run in ``_calls``, never behind it.
        self._lane = _Threads("strom-aio-poll", 1)
        self._calls = _Threads("strom-aio-consumer", CALL_THREADS)
        #: Not done while the last lane call has not settled: a poll whose records are not
        #: yet returned or put back, even though its task was cancelled. Every poll, also an
        #: inline one on the loop, waits for it first (_gated).
        self._gate: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._gate.set_result(None)
        #: The event loop a coroutine rebalance listener was given on (see subscribe).
        self._listener_loop: asyncio.AbstractEventLoop | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._sync, name)
        if name in self._BLOCKING and callable(attr):
            if getattr(_in_listener, "consumer", None) is self:
                # A plain rebalance listener method runs in the poll's worker thread and
                # cannot await: it gets the blocking method (commit() commits before the
                # partitions move, as in Kafka's listener).
                return attr
            if name in ("unsubscribe", "assign"):  # may run the listener: the lane
                return functools.wraps(attr)(functools.partial(self._in_lane, attr))
            return self._calls_of(attr)
        return attr  # seek, pause, resume, assignment, paused … never wait

    def _calls_of(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def run(*args: Any, **kwargs: Any) -> Any:
            return await self._calls.run(fn, *args, **kwargs)

        return run

    async def subscribe(
        self, topics: Any = None, pattern: str | None = None, listener: Any = None
    ) -> None:
        """Join the group, as the sync ``subscribe()``. The listener's methods may be plain
        functions or coroutine functions: they run when a poll (in a worker thread) or
        ``unsubscribe``/``close`` hands partitions over, and that waits for them, so a
        commit made in ``on_partitions_revoked`` is done before the partitions move. A
        coroutine method runs on this event loop (``await consumer.commit()``); a plain one
        runs in the worker thread, where this consumer's blocking methods (``commit()``,
        ``committed()``, ``position()`` …) are the sync ones and return their result.
        With a listener, the consumer belongs to this event loop: polling or closing it
        from another raises RuntimeError (its coroutines could not run).

        FIX (found from outside): coroutine methods were called and never awaited, and a
        plain method's ``consumer.commit()`` returned a coroutine, so nothing was committed
        and the partition's next owner read the records again."""
        loop = asyncio.get_running_loop()
        if listener is not None:
            listener = _LoopListener(listener, self, loop)
        self._listener_loop = loop if listener is not None else None
        await self._in_lane(self._sync.subscribe, topics, pattern, listener)

    def _check_loop(self) -> None:
        """Refuse a call from an event loop the rebalance listener does not run on (found
        from outside: after a second ``asyncio.run()`` the listener's calls only logged
        "Event loop is closed" and partitions moved without the revoke's commit)."""
        loop = self._listener_loop
        if loop is not None and loop is not asyncio.get_running_loop():
            raise RuntimeError(
                "this aio Consumer was subscribed with a rebalance listener on another event "
                "loop (an earlier asyncio.run()?): its listener can only run there; create "
                "the consumer, or subscribe again, on the loop that polls and closes it"
            )

    def _not_listening(self, call: str) -> None:
        """Refuse ``call`` from this consumer's own coroutine listener: the poll (or close)
        that runs the listener waits for it, and the call would wait for that one."""
        if _listening.get() is self:
            raise RuntimeError(
                f"{call}() inside this consumer's rebalance listener: the poll that runs "
                "the listener waits for it to return (commit, committed, seek … are allowed)"
            )

    async def _settled(self) -> None:
        """Wait, without a thread, until the last lane call has settled (see ``_gate``)."""
        while not self._gate.done():
            await asyncio.shield(asyncio.wrap_future(self._gate))

    async def _in_lane(self, fn: Callable[..., _R], *args: Any, **kwargs: Any) -> _R:
        """Run ``fn`` in the lane after every earlier poll has settled, and keep later polls
        out until it is done (even if the awaiting task is cancelled meanwhile)."""
        self._check_loop()
        self._not_listening(getattr(fn, "__name__", "this call"))
        await self._settled()
        gate: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._gate = gate
        done = self._lane.submit(fn, *args, **kwargs)
        done.add_done_callback(lambda _: gate.set_result(None))
        return await asyncio.shield(asyncio.wrap_future(done))

    def _inline(self) -> contextlib.AbstractContextManager[None]:
        """Around a poll made on the event loop: rebalance work is left to a poll in a
        worker thread (see :meth:`_poll_needs_thread`)."""
        group = self._sync._group
        return group.rebalance_elsewhere() if group is not None else contextlib.nullcontext()

    def _poll_needs_thread(self) -> bool:
        """Whether the next poll must run in a worker thread: it has partitions to install
        or drop, and so listener calls, which must not run on the event loop (a coroutine
        method could not be waited for there, a commit would block the loop), or partitions
        without a position, whose lookup (the group's committed offsets, ListOffsets) is a
        round trip or more — up to a second per poll while the group coordinator fails over
        (found from outside: ``poll(0)`` held the loop that long)."""
        group = self._sync._group
        if group is not None and group.rebalance_pending():
            return True
        return bool(self._sync._fetcher.needing_positions())

    async def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        """Records, as the sync ``poll()``. Cancelled while it waits (``asyncio.wait_for``),
        what the poll's worker thread took goes back: the next poll returns it."""
        records, _ = await self._gated(
            lambda ms: self._sync.poll(ms, max_records), timeout_ms, _first_of_records, bool
        )
        return records

    async def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        """An Arrow table, as the sync ``poll_arrow()``; cancellation as in :meth:`poll`."""
        table, _ = await self._gated(
            lambda ms: self._sync.poll_arrow(ms, max_records),
            timeout_ms,
            _first_of_table,
            lambda table: table.num_rows > 0,
        )
        return table

    async def _gated(
        self,
        poll: Callable[[float], Any],
        timeout_ms: float,
        first_of: Callable[[Any], dict[TopicPartition, int]],
        has_data: Callable[[Any], bool],
    ) -> tuple[Any, dict[TopicPartition, Any]]:
        """Every poll of this consumer (``poll``, ``poll_arrow``, ``async for``): after the
        last one has settled, ``poll(0)`` on the loop when that cannot block, else (or when
        it found nothing and ``timeout_ms`` allows) in the lane. Returns the result and the
        fetcher's marks of it (for a later rewind).

        FIX (found from outside): ``async for`` after a cancelled poll did not wait for
        that poll's thread, so two sync polls ran at once over the same positions (skipped
        offsets, committed past them; an IndexError in the fetcher)."""
        self._check_loop()
        self._not_listening("poll")
        await self._settled()
        if not self._poll_needs_thread():
            with self._inline():
                result = poll(0)
            if has_data(result) or timeout_ms <= 0:
                return result, self._sync._fetcher.last_marks
        return await self._poll_in_thread(poll, timeout_ms, first_of, has_data)

    async def _poll_in_thread(
        self,
        poll: Callable[[float], Any],
        timeout_ms: float,
        first_of: Callable[[Any], dict[TopicPartition, int]],
        has_data: Callable[[Any], bool],
    ) -> tuple[Any, dict[TopicPartition, Any]]:
        """Run ``poll(ms)`` in the lane for up to ``timeout_ms``, in slices of at most
        :data:`POLL_SLICE_MS`; if the awaiting task is cancelled, the thread stops after its
        slice and what it returns goes back (each partition seeks to its first offset in it,
        unless the application sought meanwhile: the sync consumer's ``_rewind_to``).
        ``_gate`` is done only when both sides are: the thread has returned, and its result
        was taken by the task or put back.

        Slices, because a cancelled poll's thread must end soon (found from outside on the
        re-check): the next poll, even ``poll(0)``, and ``close()`` wait for it to put its
        records back, and a single 20 s sync poll made them wait out the rest of its 20 s.

        FIX (found from outside): ``await asyncio.wait_for(consumer.poll(3000), 0.5)``
        timing out left the poll running in its thread; the records it then took were handed
        to nobody and the position moved past them (lost, and committed by the next commit)."""
        sync = self._sync
        lock = threading.Lock()
        #: [cancelled, (result, marks) once the thread has it and nobody took it, sides left]
        state: list[Any] = [False, None, 2]
        gate: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._gate = gate

        def side_done() -> None:  # with the lock held
            state[2] -= 1
            if not state[2]:
                gate.set_result(None)

        def run() -> tuple[Any, dict[TopicPartition, Any]]:
            try:
                end = time.monotonic() + max(timeout_ms, 0) / 1000
                while True:
                    left_ms = max(end - time.monotonic(), 0.0) * 1000
                    result = poll(min(left_ms, POLL_SLICE_MS))
                    with lock:
                        stop = state[0]
                    if stop or has_data(result) or left_ms <= POLL_SLICE_MS:
                        break
                marks = sync._fetcher.last_marks
                with lock:
                    if state[0]:
                        sync._rewind_to(first_of(result), marks)
                    else:
                        state[1] = (result, marks)
                return result, marks
            finally:
                with lock:
                    side_done()

        try:
            out = await asyncio.shield(asyncio.wrap_future(self._lane.submit(run)))
        except BaseException:  # cancelled, or the poll raised
            with lock:
                state[0] = True
                if state[1] is not None:  # done, but the task was cancelled before it got it
                    sync._rewind_to(first_of(state[1][0]), state[1][1])
                    state[1] = None
                side_done()
            raise
        with lock:
            side_done()
        return out

    async def close(self, autocommit: bool = True, timeout_ms: float | None = None) -> None:
        """Close the sync consumer once a poll still running in the lane (its task was
        cancelled) has put its records back: else the close would commit past them. Waiting
        for it counts in ``timeout_ms`` (a bad one is left to the sync close to refuse)."""
        start = time.monotonic()

        def close() -> None:
            left = timeout_ms
            if isinstance(left, int | float) and not isinstance(left, bool) and left >= 0:
                left = max(left - (time.monotonic() - start) * 1000, 0.0)
            self._sync.close(autocommit, left)

        try:
            await self._in_lane(close)
        finally:
            self._lane.shutdown()
            self._calls.shutdown()

    def __aiter__(self) -> AsyncIterator[Record]:
        self._sync._ensure_open()
        return _Records(self)

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _first_of_records(records: list[Record]) -> dict[TopicPartition, int]:
    first: dict[TopicPartition, int] = {}
    for r in records:
        first.setdefault(TopicPartition(r.topic, r.partition), r.offset)  # type: ignore[arg-type]
    return first


def _first_of_table(table: Any) -> dict[TopicPartition, int]:
    """Each partition's first offset in a polled table. Plain Python over three columns
    (only a cancelled poll's give-back needs it): Arrow's group_by warned "An input buffer
    was poorly aligned" on the fetcher's zero-copy columns at every cancelled poll_arrow."""
    first: dict[TopicPartition, int] = {}
    if not table.num_rows:
        return first
    for t, p, o in zip(
        table["topic"].to_pylist(),
        table["partition"].to_pylist(),
        table["offset"].to_pylist(),
        strict=True,
    ):
        tp = TopicPartition(t, p)
        if tp not in first or o < first[tp]:
            first[tp] = o
    return first


class _Records:
    """The iterator of ``async for record in consumer``: one polled record at a time.

    An object rather than an async generator so that leaving the loop early puts back what
    it did not hand out at once, as ``for record in consumer`` does: a loop left by
    ``break``, an exception or a cancellation drops its iterator, which CPython finalizes
    right there, while an async generator's ``finally`` is only scheduled on the event loop,
    after ``async with``'s close has committed the whole poll (found from outside: a break
    after 10 of 100 records committed 100). The records not handed out go back through the
    sync consumer's ``_rewind`` (a seek made meanwhile wins). Its polls are the consumer's
    (``Consumer._gated``): after any cancelled one has settled, and put back if cancelled.
    """

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._sync = consumer._sync
        self._records: list[Record] = []
        self._next = 0
        self._marks: dict[TopicPartition, tuple[int, int | None]] = {}

    def __aiter__(self) -> _Records:
        return self

    async def __anext__(self) -> Record:
        while True:
            if self._next < len(self._records):
                if not self._sync._moved:
                    record = self._records[self._next]
                    self._next += 1
                    # A commit made in the loop's body covers this record, not the rest of
                    # the poll (the sync consumer's _consumed_positions).
                    self._sync._handed = self._next
                    return record
                self.rewind()  # seek, pause or a new assignment inside the loop: poll afresh
            if self._sync.closed:
                raise StopAsyncIteration
            try:
                records, marks = await self._consumer._gated(
                    self._sync.poll, 500, _first_of_records, bool
                )
            except _consumer.IllegalStateError:
                if self._sync.closed:  # closed from elsewhere: the loop ends
                    raise StopAsyncIteration from None
                raise
            self._sync._moved = False
            self._records, self._next, self._marks = records, 0, marks
            self._sync._handing, self._sync._handed = (records, marks), 0

    def rewind(self) -> None:
        """Put the polled records not handed out back (their partitions seek to the first)."""
        unseen = self._records[self._next :]
        self._records, self._next = [], 0
        self._sync._handing = None
        if unseen:
            self._sync._rewind(unseen, self._marks)

    def __del__(self) -> None:
        self.rewind()


class Admin:
    """asyncio face of :class:`strom.client.admin.Admin`: every public method is awaitable."""

    @_init_as(_admin.Admin)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync = _admin.Admin(*args, **kwargs)
        self._calls = _Threads("strom-aio-admin", CALL_THREADS)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._sync, name)
        if callable(attr) and not name.startswith("_"):

            @functools.wraps(attr)
            async def run(*args: Any, **kwargs: Any) -> Any:
                return await self._calls.run(attr, *args, **kwargs)

            return run
        return attr

    async def close(self) -> None:
        try:
            await self._calls.run(self._sync.close)
        finally:
            self._calls.shutdown()

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


#: .consumer: the aio Consumer whose plain rebalance listener method runs on this thread.
_in_listener = threading.local()

#: The aio Consumer whose coroutine rebalance listener method this task runs (or None).
_listening: contextvars.ContextVar[Consumer | None] = contextvars.ContextVar(
    "strom_aio_listening", default=None
)


async def _as_listener(consumer: Consumer, coro: Coroutine[Any, Any, _R]) -> _R:
    """Run a listener coroutine marked as ``consumer``'s (see ``Consumer._not_listening``)."""
    _listening.set(consumer)  # in this task's own context only
    return await coro


_LISTENER_METHODS = frozenset(
    {"on_partitions_revoked", "on_partitions_assigned", "on_partitions_lost"}
)


class _LoopListener:
    """The rebalance listener an aio Consumer hands to the sync one (see its subscribe).

    Listener methods are called by the sync consumer's poll, which the aio consumer runs in
    a worker thread while the event loop is free: a coroutine method is run on the loop
    and waited for; a plain one is called in the thread with the consumer's blocking
    methods made synchronous. Only the methods the application's listener has exist here,
    so ``on_partitions_lost`` falls back to ``on_partitions_revoked`` as for a sync one.
    """

    def __init__(self, listener: Any, consumer: Consumer, loop: asyncio.AbstractEventLoop):
        self._listener = listener
        self._consumer = consumer
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        if name not in _LISTENER_METHODS:
            raise AttributeError(name)
        fn = getattr(self._listener, name)  # AttributeError when the listener lacks it
        return functools.partial(self._call, fn)

    def _call(self, fn: Callable[..., Any], partitions: Any) -> None:
        before = getattr(_in_listener, "consumer", None)
        _in_listener.consumer = self._consumer
        try:
            result = fn(partitions)  # a coroutine method only makes its coroutine here
        finally:
            _in_listener.consumer = before
        if inspect.iscoroutine(result):
            if _running_loop() is self._loop:
                # Waiting here would block the loop the coroutine needs (the aio consumer
                # polls in a worker thread when a rebalance is pending, so this is a bug).
                result.close()
                raise RuntimeError("an async rebalance listener called on its event loop")
            try:
                future = asyncio.run_coroutine_threadsafe(
                    _as_listener(self._consumer, result), self._loop
                )
            except RuntimeError:  # the loop is closed: the coroutine can never run
                result.close()
                raise
            # This thread is inside the poll (it holds the consumer: ConcurrentModification-
            # Error for any other) and does nothing but wait: the coroutine's calls
            # (``await consumer.commit()``, in a thread of their own) may use the consumer.
            sync = self._consumer._sync
            sync._lent = True
            try:
                future.result()
            finally:
                sync._lent = False


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
