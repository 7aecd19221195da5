"""Clients used in a forked child fail clearly instead of hanging.

gRPC is not fork-safe: a child process inherits the parent's channels, but not the threads
that serve them (gRPC's, the producer's sender, the consumer's fetchers), so a Producer made before
``os.fork()`` (or a ``multiprocessing`` fork worker) took the child's ``send()`` and its future
would never complete. Every client registers here; in the child, an ``os.register_at_fork`` hook
marks them all, and their next use raises :class:`~strom.errors.ForkedClientError` naming the
process that made them. The mark costs the calls nothing: they test a flag they already
test (the producer's ``send`` its ``_closing``), or one attribute.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from strom.errors import ForkedClientError

#: Every live client (Producer, Consumer, Admin, ClusterClient) of this process.
_clients: weakref.WeakSet[Any] = weakref.WeakSet()


def track(client: Any) -> None:
    """Register ``client`` (made in this process): ``client._forked_from`` is 0 until the
    process forks, then (in the child) the pid of the process that made it."""
    client._forked_from = 0
    client._made_in = os.getpid()
    _clients.add(client)


def error(client: Any) -> ForkedClientError:
    """The error a client used in a forked child raises."""
    return ForkedClientError(
        f"this {type(client).__name__} was created in process {client._made_in} and this is "
        f"process {os.getpid()}, a fork() of it: gRPC connections do not survive a fork; "
        "create clients after fork() (in each child process)"
    )


def _in_child() -> None:
    for client in list(_clients):
        client._forked_from = client._made_in
        hook = getattr(client, "_after_fork", None)
        if hook is not None:
            hook()
    _clients.clear()


os.register_at_fork(after_in_child=_in_child)
