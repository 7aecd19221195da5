"""One committer's offset commits, sent in the order they were made.

Kafka's rule, which strom's users rely on: a member's commits take effect in the order it made
them, a synchronous ``commit()`` returns only after every earlier ``commit_async()`` is done
(their callbacks have run), and what ``committed()`` reads back after ``commit()`` is what was
committed. gRPC orders nothing between separate calls (DESIGN §6, "Order on the wire"), so the
order must be made here:

- Every commit, synchronous or not, joins one queue, served by one thread; a synchronous
  commit waits for its own turn. (A synchronous commit made while nothing is queued or in
  flight is sent from its caller's thread, the queue's turn taken meanwhile: the order is
  the same, and two thread hand-offs are saved.)
- Commits still waiting when the thread is free go out together as one OffsetCommit, merged in
  order (a later offset for a partition replaces an earlier one): thousands of ``commit_async``
  calls made faster than the coordinator answers cost a handful of requests, and the end state
  is the one applying them one by one would give. Each commit still gets its own result and
  callback, in order, with the errors of its own partitions.
- Asynchronous commits linger: a request goes out at most once per ``linger_s`` (measured
  from the start of the last one), so a consumer that calls ``commit_async`` after every poll
  costs the coordinator and the partition leader tens of requests per second, not hundreds.
  The first commit after a pause goes at once; a synchronous commit, ``flush`` and ``close``
  send what waits at once. Each OffsetCommit costs ~1 ms of CPU on the coordinator and the
  node; at 10,000 records/s one per poll took a quarter of the 2 cores the fetches share.
- Each request carries the committer's id and a number that grows with every request, so the
  coordinator can refuse to let an older request that reached it late (an attempt the client
  had given up on, a delayed retry) overwrite a newer one.

This module knows nothing of gRPC: ``send`` does the request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from strom.client.types import OffsetAndMetadata, TopicPartition
from strom.errors import RequestTimedOutError, StromError

log = logging.getLogger("strom.client.commits")

Offsets = Mapping[TopicPartition, OffsetAndMetadata]
#: ``send(offsets, sequence[, timeout_s])``: commit ``offsets`` as request number ``sequence``
#: (within ``timeout_s`` when given); returns the per-partition error (None = committed) or
#: raises the error of the whole request.
Send = Callable[..., Mapping[TopicPartition, Any]]
Callback = Callable[[Offsets, BaseException | None], object]


class CommitQueueClosedError(StromError):
    """The consumer was closed before the commit could be sent."""


@dataclass
class _Commit:
    offsets: dict[TopicPartition, OffsetAndMetadata]
    callback: Callback | None
    #: A synchronous commit: someone waits for it, so no lingering.
    sync: bool = False
    done: Future[None] = field(default_factory=Future)


class CommitQueue:
    """Commits in order on one thread (see the module docstring)."""

    def __init__(self, send: Send, *, linger_s: float = 0.0, name: str = "strom-commit") -> None:
        self._send = send
        self._linger_s = max(linger_s, 0.0)
        #: When the last request started (monotonic s); lingering counts from there.
        self._last_sent = float("-inf")
        #: A synchronous commit or a flush waits: send what is pending without lingering.
        self._urgent = False
        self._cond = threading.Condition()
        self._pending: list[_Commit] = []
        self._busy = False
        self._closed = False
        self._sequence = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def commit_async(self, offsets: Offsets, callback: Callback | None = None) -> Future[None]:
        """Queue a commit; ``callback(offsets, error)`` runs on the commit thread when done."""
        return self._enqueue(_Commit(dict(offsets), callback))

    def _enqueue(self, c: _Commit) -> Future[None]:
        with self._cond:
            if self._closed:
                raise CommitQueueClosedError("the consumer is closed")
            self._pending.append(c)
            if c.sync:
                self._urgent = True
                self._cond.notify()
            elif len(self._pending) == 1:
                # Only an idle thread needs waking: one lingering or sending finds this one
                # when it looks (a wake-up per commit_async cost a thread switch per poll).
                self._cond.notify()
        return c.done

    def commit(self, offsets: Offsets, timeout_s: float) -> None:
        """Commit after every earlier commit is done; raise its error.

        Raises RequestTimedOutError if it was not done within ``timeout_s`` (a commit still
        waiting in the queue then is taken out of it and never sent).
        """
        if threading.current_thread() is self._thread:  # from a callback: no waiting on itself
            c = _Commit(dict(offsets), None)
            self._deliver([c])
            c.done.result()
            return
        c = _Commit(dict(offsets), None, sync=True)
        if self._claim_idle():
            # Nothing earlier is waiting or in flight: this commit is next in order anyway,
            # and sending it from the caller's thread saves two thread hand-offs (waking the
            # commit thread, then the caller): on the 2-core VM p50 0.2-0.6 ms of a ~3 ms
            # commit (docs/benchmarks.md). Commits made meanwhile queue behind it.
            try:
                self._deliver([c], timeout_s)
            finally:
                self._release()
            c.done.result()
            return
        done = self._enqueue(c)
        try:
            done.result(timeout=max(timeout_s, 0.0))
        except TimeoutError:
            with self._cond:
                for c in self._pending:
                    if c.done is done:
                        self._pending.remove(c)
                        break
            raise RequestTimedOutError(
                f"commit not done within {timeout_s * 1000:.0f} ms (earlier commits were still "
                "being sent, or the coordinator did not answer)"
            ) from None

    def _claim_idle(self) -> bool:
        """Take the sender's turn if the queue is idle (nothing pending, nothing in flight);
        False otherwise. Raises CommitQueueClosedError once closed."""
        with self._cond:
            if self._closed:
                raise CommitQueueClosedError("the consumer is closed")
            if self._pending or self._busy:
                return False
            self._busy = True
            self._last_sent = time.monotonic()  # the linger counts from this request too
            return True

    def _release(self) -> None:
        """End a turn taken by :meth:`_claim_idle`: the commit thread may send again."""
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    @property
    def queued(self) -> int:
        """Commits waiting for the request in flight to finish."""
        with self._cond:
            return len(self._pending)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued commit is done; False on timeout."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._busy:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if self._pending and not self._urgent:
                    self._urgent = True  # no lingering for what a flush waits on
                    self._cond.notify_all()
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is queued (up to ``timeout_s``), then stop; later commits fail."""
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            left, self._pending = self._pending, []
            self._cond.notify_all()
        err = CommitQueueClosedError("the consumer was closed before the commit was sent")
        for c in left:
            self._finish(c, err)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    # -- the commit thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    # (busy here: a synchronous commit is being sent from its caller's thread)
                    while (not self._pending or self._busy) and not self._closed:
                        self._cond.wait()
                    if not self._pending:
                        return
                    left = self._last_sent + self._linger_s - time.monotonic()
                    if left <= 0 or self._urgent or self._closed:
                        break
                    self._cond.wait(left)
                batch, self._pending = self._pending, []
                self._urgent = False
                self._last_sent = time.monotonic()
                self._busy = True
            try:
                self._deliver(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _deliver(self, batch: list[_Commit], timeout_s: float | None = None) -> None:
        """One request for ``batch`` (merged in order), then each commit's result in order;
        ``timeout_s`` (a synchronous commit sent from its caller's thread) bounds the request
        by the caller's timeout (a close's budget, say) rather than the sender's own."""
        merged: dict[TopicPartition, OffsetAndMetadata] = {}
        for c in batch:
            merged.update(c.offsets)
        self._sequence += 1
        errors: Mapping[TopicPartition, Any] = {}
        failure: BaseException | None = None
        try:
            if timeout_s is None:
                errors = self._send(merged, self._sequence)
            else:
                errors = self._send(merged, self._sequence, timeout_s)
        except BaseException as exc:
            failure = exc
        for c in batch:
            err = failure
            if err is None:
                err = next((errors[tp] for tp in c.offsets if errors.get(tp) is not None), None)
            self._finish(c, err)

    @staticmethod
    def _finish(c: _Commit, err: BaseException | None) -> None:
        if c.callback is not None:
            try:
                c.callback(c.offsets, err)
            except Exception:
                log.exception("commit callback failed")
        if err is None:
            c.done.set_result(None)
        else:
            c.done.set_exception(err)
