"""Per-record futures that cost almost nothing until someone waits on them.

``Producer.send`` must return a :class:`concurrent.futures.Future` (so ``.result()`` and
``.add_done_callback()`` work as users expect), but a real ``Future`` builds a
``threading.Condition`` — about 1.7 µs, more than the whole rest of ``send``. As in Kafka's
Java client (``FutureRecordMetadata`` over a per-batch ``ProduceRequestResult``), the state
lives once per batch in :class:`BatchResult`; a :class:`FutureRecordMetadata` is just (batch,
index). It still *is* a ``concurrent.futures.Future``: the first time something reaches for
the base class's internals (``concurrent.futures.wait`` / ``as_completed`` do), the real
machinery is built on the spot and completed from the batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

from strom.client.kwnames import wait_limit
from strom.client.types import RecordMetadata

log = logging.getLogger(__name__)

#: Attributes of ``concurrent.futures.Future`` that module functions touch directly.
_INTERNALS = frozenset(
    {"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"}
)


class BatchResult:
    """The outcome of one produced batch, shared by the futures of its records.

    Completing it runs, in order: the delivery callbacks (``send(callback=...)``), then
    marks it done, then the callbacks of ``add_done_callback`` (which, as with any
    ``concurrent.futures.Future``, see a done future: asyncio's ``wrap_future`` relies on
    that), and only then wakes the threads waiting in :meth:`wait` (``result()``,
    ``flush()``). So, as in Kafka's Java client (a record's callback runs before its future
    completes), when ``flush()`` returns every callback of the records it waited for has
    run.
    The callbacks run on the thread that completes the batch, one at a time; one that waits
    on this same batch (``future.result()`` inside its own callback) is answered at once.
    """

    __slots__ = (
        "_callbacks",
        "_deliveries",
        "_event",
        "_finished",
        "_lock",
        "_owner",
        "_parts",
        "base_offset",
        "done",
        "error",
        "log_append_time",
        "partition",
        "timestamps",
        "topic",
    )

    def __init__(self, topic: str, partition: int, timestamps: Any) -> None:
        self.topic = topic
        self.partition = partition
        #: Per-record create timestamps (the list the batch appends to, or a numpy array).
        self.timestamps = timestamps
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        #: The outcome is visible (every delivery callback has run).
        self.done = False
        #: Every callback has run and the waiters are (being) woken.
        self._finished = False
        #: The thread running the callbacks (0: not being completed yet).
        self._owner = 0
        self._event: threading.Event | None = None
        self._deliveries: list[Callable[[], None]] | None = None
        self._callbacks: list[Callable[[], None]] | None = None
        self._lock = threading.Lock()
        #: After a split (the producer's answer to MESSAGE_TOO_LARGE): (first index, result)
        #: of each part, in order; each record's outcome is its part's.
        self._parts: list[tuple[int, BatchResult]] | None = None

    def _part(self, index: int) -> tuple[BatchResult, int]:
        """The result holding record ``index`` of this batch, and its index there."""
        parts = self._parts
        if parts is None:
            return self, index
        for start, part in reversed(parts):
            if index >= start:
                return part._part(index - start)
        raise IndexError(index)

    def error_of(self, index: int) -> BaseException | None:
        """Record ``index``'s error (None: written); its part's after a split."""
        if self._parts is None:
            return self.error
        return self._part(index)[0].error

    def split(self, parts: list[tuple[int, BatchResult]]) -> None:
        """The batch was split (Kafka's ``splitAndReenqueue``): each record's outcome is
        that of the part holding it (``parts``: first index and result, in order), and this
        batch is done once every part is, failed with the first part's error if any failed
        (each record's future still answers with its own part's outcome)."""
        self._parts = parts
        left = [len(parts)]
        lock = threading.Lock()

        def one_done() -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            err = next((p.error for _, p in parts if p.error is not None), None)
            if err is None:
                self.complete(-1)
            else:
                self.fail(err)

        for _, part in parts:
            part.on_done(one_done)

    def metadata(self, index: int) -> RecordMetadata:
        if self._parts is not None:
            part, i = self._part(index)
            return part.metadata(i)
        base = self.base_offset
        ts = self.log_append_time if self.log_append_time >= 0 else int(self.timestamps[index])
        return RecordMetadata(self.topic, self.partition, base + index if base >= 0 else -1, ts)

    def wait(self, timeout: float | None) -> bool:
        """Wait until the outcome is known (``result()``): at once once done."""
        return self.done or self._wait(timeout)

    def wait_callbacks(self, timeout: float | None) -> bool:
        """Wait until every callback has run too (``flush()``)."""
        return self._finished or self._wait(timeout)

    def _wait(self, timeout: float | None) -> bool:
        timeout = wait_limit("timeout", timeout)  # (2**63 overflowed threading's wait)
        with self._lock:
            if self._finished or self._owner == threading.get_ident():
                # (the thread running the callbacks, waiting on this batch from one of them:
                # the outcome is settled, and waiting for itself would never end)
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def on_delivery(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` before the batch is done (a record's delivery callback); at once when
        the outcome is already settled."""
        with self._lock:
            if not self._owner:
                if self._deliveries is None:
                    self._deliveries = []
                self._deliveries.append(fn)
                return
        _run(fn)

    def on_done(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once done (at once if already)."""
        with self._lock:
            if not self._finished:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        _run(fn)

    def complete(self, base_offset: int, log_append_time: int = -1) -> None:
        with self._lock:
            if self._owner:  # settled already (see _claim)
                return
            self._claim()
            self.base_offset = base_offset
            self.log_append_time = log_append_time
        self._finish()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self._owner:
                return
            self._claim()
            self.error = error
        self._finish()

    def _claim(self) -> None:
        """With the lock held: the outcome is this thread's to set, and its callbacks to run.
        Only the first completion counts (a batch failed by ``close()`` while its answer
        arrives, or failed by a callback's ``close()`` while its own callbacks run)."""
        self._owner = threading.get_ident()

    def _finish(self) -> None:
        with self._lock:
            deliveries, self._deliveries = self._deliveries, None
        for fn in deliveries or ():
            _run(fn)
        self.done = True
        while True:
            with self._lock:
                callbacks, self._callbacks = self._callbacks, None
                if not callbacks:  # (one added by a callback runs too, before the wake-up)
                    self._finished = True
                    event = self._event
                    break
            for fn in callbacks:
                _run(fn)
        if event is not None:
            event.set()


def _run(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:
        log.exception("a produce callback raised")


class FutureRecordMetadata(Future):  # type: ignore[type-arg]
    """The future of one sent record: resolves to its :class:`RecordMetadata`."""

    # Deliberately does not call Future.__init__ (see the module docstring).
    def __init__(self, batch: BatchResult, index: int) -> None:
        self._batch = batch
        self._index = index

    def __getattr__(self, name: str) -> Any:
        if name in _INTERNALS and "_batch" in self.__dict__ and "_condition" not in self.__dict__:
            Future.__init__(self)
            self._batch.on_done(self._settle_base)
            return getattr(self, name)
        raise AttributeError(name)

    def _settle_base(self) -> None:
        err = self._batch.error_of(self._index)
        if err is not None:
            Future.set_exception(self, err)
        else:
            Future.set_result(self, self._batch.metadata(self._index))

    # -- the public Future API, answered from the batch ----------------------------------

    def cancel(self) -> bool:
        return False  # a record handed to the producer cannot be taken back

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self._batch.done

    def done(self) -> bool:
        return self._batch.done

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if not self._batch.wait(timeout):
            raise FutureTimeoutError()
        err = self._batch.error_of(self._index)
        if err is not None:
            raise err
        return self._batch.metadata(self._index)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """:meth:`result` under kafka-python's name (``producer.send(...).get(timeout=10)``),
        so code written against that client runs unchanged."""
        return self.result(timeout)

    def add_callback(
        self, fn: Callable[..., object], *args: Any, **kwargs: Any
    ) -> FutureRecordMetadata:
        """kafka-python's: ``fn(*args, metadata, **kwargs)`` once the record is acknowledged
        (never if it fails); returns this future, so calls chain
        (``send(...).add_callback(ok).add_errback(err)``). Runs on the producer's thread, or
        at once on this one if the record is already done; an exception it raises is logged.
        """
        batch, index = self._batch, self._index

        def ok() -> None:
            if batch.error_of(index) is None:
                fn(*args, batch.metadata(index), **kwargs)

        batch.on_done(ok)
        return self

    def add_errback(
        self, fn: Callable[..., object], *args: Any, **kwargs: Any
    ) -> FutureRecordMetadata:
        """kafka-python's: ``fn(*args, exception, **kwargs)`` if the record fails (never if
        it is acknowledged); returns this future. Runs as :meth:`add_callback`'s do."""
        batch, index = self._batch, self._index

        def failed() -> None:
            err = batch.error_of(index)
            if err is not None:
                fn(*args, err, **kwargs)

        batch.on_done(failed)
        return self

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._batch.wait(timeout):
            raise FutureTimeoutError()
        return self._batch.error_of(self._index)

    def add_done_callback(self, fn: Callable[[Future], object]) -> None:  # type: ignore[type-arg]
        self._batch.on_done(lambda: fn(self))

    def set_running_or_notify_cancel(self) -> bool:
        return True

    def set_result(self, result: Any) -> None:
        raise RuntimeError("a record's future is completed by the producer")

    def set_exception(self, exception: BaseException | None) -> None:
        raise RuntimeError("a record's future is completed by the producer")


__all__ = ["BatchResult", "CancelledError", "FutureRecordMetadata"]
